//! The CNI protocol: reading the environment and stdin as libcni passes them, dispatching
//! ADD/DEL/CHECK/VERSION (parsed by the `cni-plugin` crate) and 1.1's STATUS and GC
//! (handled here, the crate predates them), and writing results and errors in the shape of
//! the requested spec version.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use cni_plugin::macaddr::MacAddr;
use cni_plugin::reply::{Dns, ErrorReply, Interface, Ip, Route, SuccessReply};
use ipnetwork::{IpNetwork, Ipv4Network};
use serde_json::{Value, json};

use crate::config::{self, PluginConfig, SUPPORTED_VERSIONS};
use crate::ipam::{self, IpamStore};
use crate::pod::{self, Attached, GATEWAY};

/// CNI error codes (spec "Error codes").
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const CONTAINER_UNKNOWN: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const NOT_AVAILABLE_DEGRADED: u32 = 51;
    /// skel's catch-all for plugin failures without a spec code.
    pub const INTERNAL: u32 = 999;
}

/// The latest spec version; used for replies when the request's version is unknown.
pub const LATEST_VERSION: &str = "1.1.0";

/// A CNI error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self { code, msg: msg.into(), details: details.into() }
    }
}

/// The full chain of an error's causes, for `details`.
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

impl From<config::Error> for CniError {
    fn from(e: config::Error) -> Self {
        let code = match e {
            config::Error::Decode(_) => code::DECODE_FAILURE,
            config::Error::Invalid(_) => code::INVALID_CONFIG,
            config::Error::IncompatibleVersion(_) => code::INCOMPATIBLE_VERSION,
            // The agent writes the node file shortly: the runtime retries the sandbox.
            config::Error::NoPodCidrYet(_) => code::TRY_AGAIN_LATER,
        };
        Self::new(code, e.to_string(), chain(&e))
    }
}

impl From<pod::Error> for CniError {
    fn from(e: pod::Error) -> Self {
        let code = match &e {
            // Addresses free up as pods are deleted: the runtime retries.
            pod::Error::Ipam(ipam::Error::Exhausted { .. }) => code::TRY_AGAIN_LATER,
            pod::Error::Ipam(_) => code::IO_FAILURE,
            _ => code::INTERNAL,
        };
        Self::new(code, e.to_string(), chain(&e))
    }
}

/// The commands: the four `cni-plugin` knows plus 1.1's STATUS and GC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl FromStr for Command {
    type Err = CniError;

    fn from_str(s: &str) -> Result<Self, CniError> {
        match s {
            "STATUS" => Ok(Self::Status),
            "GC" => Ok(Self::Gc),
            other => match cni_plugin::Command::from_str(other) {
                Ok(cni_plugin::Command::Add) => Ok(Self::Add),
                Ok(cni_plugin::Command::Del) => Ok(Self::Del),
                Ok(cni_plugin::Command::Check) => Ok(Self::Check),
                Ok(cni_plugin::Command::Version) => Ok(Self::Version),
                Err(_) => Err(CniError::new(
                    code::INVALID_ENV,
                    format!("unknown CNI_COMMAND {other:?}"),
                    "expected ADD, DEL, CHECK, VERSION, STATUS or GC",
                )),
            },
        }
    }
}

/// What one invocation prints on stdout and exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub exit_code: i32,
}

/// The environment variables one command needs.
struct Args {
    container_id: String,
    ifname: String,
    netns: Option<PathBuf>,
}

fn require(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<String, CniError> {
    env(var)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| CniError::new(code::INVALID_ENV, format!("{var} is required"), ""))
}

/// libcni's `ValidateContainerID` and `ValidateInterfaceName`.
fn validate_args(container_id: &str, ifname: &str) -> Result<(), CniError> {
    let mut chars = container_id.chars();
    let id_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if !id_ok {
        return Err(CniError::new(
            code::INVALID_ENV,
            "invalid CNI_CONTAINERID",
            format!("{container_id:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$"),
        ));
    }
    let if_ok = !ifname.is_empty()
        && ifname.len() <= 15
        && ifname != "."
        && ifname != ".."
        && !ifname.chars().any(|c| c == '/' || c == ':' || c.is_whitespace());
    if !if_ok {
        return Err(CniError::new(code::INVALID_ENV, "invalid CNI_IFNAME", format!("{ifname:?}")));
    }
    Ok(())
}

fn args(env: &dyn Fn(&str) -> Option<String>, cmd: Command) -> Result<Args, CniError> {
    let container_id = require(env, "CNI_CONTAINERID")?;
    let ifname = require(env, "CNI_IFNAME")?;
    validate_args(&container_id, &ifname)?;
    let netns = match cmd {
        Command::Add | Command::Check => Some(PathBuf::from(require(env, "CNI_NETNS")?)),
        _ => env("CNI_NETNS").filter(|v| !v.is_empty()).map(PathBuf::from),
    };
    Ok(Args { container_id, ifname, netns })
}

/// Runs one invocation: `env` reads the CNI_* variables, `payload` is stdin.
pub fn run(env: &dyn Fn(&str) -> Option<String>, payload: &[u8]) -> Outcome {
    let reply_version = config::peek_version(payload)
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| LATEST_VERSION.to_owned());
    match dispatch(env, payload) {
        Ok(stdout) => Outcome { stdout, exit_code: 0 },
        Err(e) => Outcome { stdout: error_json(&reply_version, &e), exit_code: 1 },
    }
}

fn error_json(version: &str, e: &CniError) -> String {
    let version = semver::Version::parse(version).unwrap_or_else(|_| semver::Version::new(1, 1, 0));
    let reply = ErrorReply {
        cni_version: version,
        code: i32::try_from(e.code).unwrap_or(i32::MAX),
        msg: &e.msg,
        details: e.details.clone(),
    };
    serde_json::to_string(&reply).unwrap_or_else(|_| {
        json!({"cniVersion": LATEST_VERSION, "code": e.code, "msg": e.msg, "details": e.details}).to_string()
    })
}

fn dispatch(env: &dyn Fn(&str) -> Option<String>, payload: &[u8]) -> Result<String, CniError> {
    let cmd: Command = require(env, "CNI_COMMAND")?.parse()?;
    if cmd == Command::Version {
        return version_reply(payload);
    }
    let args = match cmd {
        Command::Add | Command::Del | Command::Check => Some(args(env, cmd)?),
        _ => None,
    };
    let cfg = match cmd {
        Command::Del => PluginConfig::parse_for_del(payload)?,
        // STATUS's answer for "no ADD could succeed now".
        Command::Status => PluginConfig::parse(payload).map_err(|e| match e {
            config::Error::NoPodCidrYet(_) => {
                CniError::new(code::NOT_AVAILABLE, e.to_string(), chain(&e))
            }
            e => e.into(),
        })?,
        _ => PluginConfig::parse(payload)?,
    };
    if matches!(cmd, Command::Status | Command::Gc) && cfg.cni_version != "1.1.0" {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("config version {} does not allow {cmd:?}", cfg.cni_version),
            "STATUS and GC exist from spec 1.1.0 on",
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::new(code::INTERNAL, "starting the runtime", e.to_string()))?;
    rt.block_on(async {
        match (cmd, args) {
            (Command::Add, Some(a)) => {
                let netns = a.netns.unwrap_or_default();
                let attached = pod::add(&cfg, &a.container_id, &a.ifname, &netns).await?;
                Ok(add_result(&cfg.cni_version, &attached, &netns, cfg.prev_result.as_ref()))
            }
            (Command::Del, Some(a)) => {
                pod::del(&cfg, &a.container_id, &a.ifname).await?;
                Ok(String::new())
            }
            (Command::Check, Some(a)) => {
                let ip = prev_result_ip(&cfg, &a.ifname)?;
                pod::check(&cfg, &a.container_id, &a.ifname, &a.netns.unwrap_or_default(), ip)
                    .await?;
                Ok(String::new())
            }
            (Command::Status, _) => status(&cfg).map(|()| String::new()),
            (Command::Gc, _) => {
                let valid = cfg.valid_attachments.clone().ok_or_else(|| {
                    CniError::new(code::INVALID_CONFIG, "GC needs cni.dev/valid-attachments", "")
                })?;
                pod::gc(&cfg, &valid).await?;
                Ok(String::new())
            }
            _ => Err(CniError::new(code::INTERNAL, "unreachable command state", "")),
        }
    })
}

fn version_reply(payload: &[u8]) -> Result<String, CniError> {
    let v: Value = serde_json::from_slice(payload).map_err(|e| {
        CniError::new(code::DECODE_FAILURE, "decoding the VERSION request", e.to_string())
    })?;
    let requested = v.get("cniVersion").and_then(Value::as_str).unwrap_or(LATEST_VERSION);
    let reply_version =
        if SUPPORTED_VERSIONS.contains(&requested) { requested } else { LATEST_VERSION };
    Ok(json!({"cniVersion": reply_version, "supportedVersions": SUPPORTED_VERSIONS}).to_string())
}

/// STATUS: ready when the IPAM store is usable and has a free address.
fn status(cfg: &PluginConfig) -> Result<(), CniError> {
    let store = IpamStore::new(cfg.network_dir(), cfg.pod_cidr);
    match store.has_free() {
        Ok(true) => Ok(()),
        Ok(false) => Err(CniError::new(
            code::NOT_AVAILABLE,
            format!("no free address left in {}", cfg.pod_cidr),
            "",
        )),
        Err(e) => Err(CniError::new(code::NOT_AVAILABLE, "IPAM store unusable", chain(&e))),
    }
}

/// The address prevResult gives this attachment: the IPv4 address on the interface named
/// `ifname` inside a sandbox (other plugins of a chain may have added their own).
fn prev_result_ip(cfg: &PluginConfig, ifname: &str) -> Result<Ipv4Addr, CniError> {
    let prev = cfg
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::new(code::INVALID_CONFIG, "CHECK needs prevResult", ""))?;
    let ours = prev.get("interfaces").and_then(Value::as_array).and_then(|ifs| {
        ifs.iter().position(|i| {
            i.get("name").and_then(Value::as_str) == Some(ifname)
                && i.get("sandbox").and_then(Value::as_str).is_some_and(|s| !s.is_empty())
        })
    });
    let ips = prev.get("ips").and_then(Value::as_array).cloned().unwrap_or_default();
    let v4 = |ip: &Value| ip.get("address")?.as_str()?.parse::<Ipv4Network>().ok().map(|n| n.ip());
    let on_ours = ips.iter().find(|ip| {
        ours.is_some() && ip.get("interface").and_then(Value::as_u64) == ours.map(|i| i as u64)
    });
    on_ours
        .and_then(v4)
        .or_else(|| ips.iter().filter_map(v4).find(|ip| !ip.is_loopback()))
        .ok_or_else(|| {
            CniError::new(code::INVALID_CONFIG, "prevResult has no IPv4 address", prev.to_string())
        })
}

fn mac(bytes: &[u8]) -> Option<MacAddr> {
    let s: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    s.join(":").parse().ok()
}

/// The ADD result in the requested version's shape (0.4.0 adds `"version": "4"` to IPs).
/// When chained after another plugin, `prev` (its result) comes first and is kept, as the
/// spec requires; this plugin's interface indices follow the previous ones.
pub fn add_result(version: &str, a: &Attached, netns: &Path, prev: Option<&Value>) -> String {
    let offset =
        prev.and_then(|p| p.get("interfaces")).and_then(Value::as_array).map_or(0, Vec::len);
    let reply = SuccessReply {
        cni_version: semver::Version::parse(version)
            .unwrap_or_else(|_| semver::Version::new(1, 1, 0)),
        interfaces: vec![
            Interface {
                name: a.host_ifname.clone(),
                mac: mac(&a.host_mac),
                sandbox: PathBuf::new(),
            },
            Interface {
                name: a.pod_ifname.clone(),
                mac: mac(&a.pod_mac),
                sandbox: netns.to_path_buf(),
            },
        ],
        ips: vec![Ip {
            address: IpNetwork::V4(
                Ipv4Network::new(a.ip, a.prefix_len).unwrap_or_else(|_| Ipv4Network::from(a.ip)),
            ),
            gateway: Some(IpAddr::V4(GATEWAY)),
            interface: Some(offset + 1),
        }],
        routes: vec![Route {
            dst: IpNetwork::V4(Ipv4Network::from(Ipv4Addr::UNSPECIFIED).mask_to(0)),
            gw: Some(IpAddr::V4(GATEWAY)),
        }],
        dns: Dns::default(),
        specific: Default::default(),
    };
    let mut v = serde_json::to_value(&reply).unwrap_or(Value::Null);
    // Host interfaces carry no sandbox: drop the empty field the crate always writes.
    if let Some(Value::Array(ifs)) = v.get_mut("interfaces") {
        for i in ifs {
            if i.get("sandbox").and_then(Value::as_str) == Some("")
                && let Some(o) = i.as_object_mut()
            {
                o.remove("sandbox");
            }
        }
    }
    if let Some(prev) = prev {
        for key in ["interfaces", "ips", "routes"] {
            if let (Some(Value::Array(before)), Some(Value::Array(ours))) =
                (prev.get(key), v.get_mut(key))
            {
                let mut merged = before.clone();
                merged.append(ours);
                *ours = merged;
            }
        }
        if let Some(dns) = prev.get("dns") {
            v["dns"] = dns.clone();
        }
    }
    if version == "0.4.0"
        && let Some(Value::Array(ips)) = v.get_mut("ips")
    {
        for o in ips.iter_mut().filter_map(Value::as_object_mut) {
            o.insert("version".into(), json!("4"));
        }
    }
    v.to_string()
}

trait MaskTo {
    fn mask_to(self, prefix: u8) -> Ipv4Network;
}

impl MaskTo for Ipv4Network {
    fn mask_to(self, prefix: u8) -> Ipv4Network {
        Ipv4Network::new(self.ip(), prefix).unwrap_or(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run_with(vars: &[(&str, &str)], payload: &str) -> (Value, i32) {
        let map: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let out = run(&|k| map.get(k).cloned(), payload.as_bytes());
        let v = if out.stdout.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&out.stdout).unwrap()
        };
        (v, out.exit_code)
    }

    #[test]
    fn version_lists_supported_versions() {
        let (v, rc) = run_with(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
        assert_eq!(rc, 0);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["supportedVersions"], json!(["0.4.0", "1.0.0", "1.1.0"]));
    }

    #[test]
    fn env_errors_are_code_4() {
        let cfg = r#"{"cniVersion":"1.1.0","name":"n","type":"skiff-cni","podCIDR":"10.1.0.0/24"}"#;
        for vars in [
            vec![],
            vec![("CNI_COMMAND", "FROB")],
            vec![("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "eth0"), ("CNI_NETNS", "/x")],
            vec![
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "-bad"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS", "/x"),
            ],
            vec![
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", "c"),
                ("CNI_IFNAME", "eth0/1"),
                ("CNI_NETNS", "/x"),
            ],
            vec![("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0")],
        ] {
            let (v, rc) = run_with(&vars, cfg);
            assert_eq!(rc, 1, "{vars:?}");
            assert_eq!(v["code"], 4, "{vars:?}: {v}");
            assert_eq!(v["cniVersion"], "1.1.0");
        }
    }

    #[test]
    fn status_and_gc_need_1_1() {
        for cmd in ["STATUS", "GC"] {
            let (v, rc) = run_with(
                &[("CNI_COMMAND", cmd)],
                r#"{"cniVersion":"1.0.0","name":"n","type":"skiff-cni","podCIDR":"10.1.0.0/24"}"#,
            );
            assert_eq!((rc, v["code"].as_u64()), (1, Some(1)), "{cmd}: {v}");
            assert_eq!(v["cniVersion"], "1.0.0");
        }
    }

    #[test]
    fn a_node_file_not_written_yet_is_try_again_for_add_and_not_available_for_status() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = format!(
            r#"{{"cniVersion":"1.1.0","name":"n","type":"skiff-cni","nodeConfig":"{}","dataDir":"{}"}}"#,
            dir.path().join("node.json").display(),
            dir.path().display()
        );
        let add = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/proc/self/ns/net"),
        ];
        let (v, rc) = run_with(&add, &cfg);
        assert_eq!((rc, v["code"].as_u64()), (1, Some(11)), "{v}");
        assert!(v["msg"].as_str().unwrap().contains("no pod CIDR yet"), "{v}");
        let (v, rc) = run_with(&[("CNI_COMMAND", "STATUS")], &cfg);
        assert_eq!((rc, v["code"].as_u64()), (1, Some(50)), "{v}");
    }

    #[test]
    fn add_result_shapes_follow_the_version() {
        let a = Attached {
            ip: "10.1.0.5".parse().unwrap(),
            prefix_len: 32,
            host_ifname: "sk0123456789ab".into(),
            host_mac: vec![2, 0, 0, 0, 0, 1],
            pod_ifname: "eth0".into(),
            pod_mac: vec![2, 0, 0, 0, 0, 2],
        };
        let v: Value =
            serde_json::from_str(&add_result("0.4.0", &a, Path::new("/run/netns/x"), None))
                .unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["ips"][0]["address"], "10.1.0.5/32");
        assert_eq!(v["ips"][0]["gateway"], "169.254.1.1");
        assert_eq!(v["ips"][0]["interface"], 1);
        assert_eq!(v["interfaces"][1]["sandbox"], "/run/netns/x");
        assert!(v["interfaces"][0].get("sandbox").is_none());
        assert_eq!(v["interfaces"][1]["mac"], "02:00:00:00:00:02");
        assert_eq!(v["routes"][0]["dst"], "0.0.0.0/0");
        let v: Value =
            serde_json::from_str(&add_result("1.1.0", &a, Path::new("/run/netns/x"), None))
                .unwrap();
        assert!(v["ips"][0].get("version").is_none());
        // Chained: the previous result is kept first, our interface index follows it.
        let prev = json!({"cniVersion":"1.1.0","interfaces":[{"name":"lo"}],
            "ips":[{"address":"127.0.0.1/8","interface":0}],"dns":{"nameservers":["10.96.0.10"]}});
        let v: Value =
            serde_json::from_str(&add_result("1.1.0", &a, Path::new("/run/netns/x"), Some(&prev)))
                .unwrap();
        assert_eq!(v["interfaces"].as_array().unwrap().len(), 3);
        assert_eq!(v["interfaces"][0]["name"], "lo");
        assert_eq!(v["ips"][0]["address"], "127.0.0.1/8");
        assert_eq!(v["ips"][1]["address"], "10.1.0.5/32");
        assert_eq!(v["ips"][1]["interface"], 2);
        assert_eq!(v["dns"]["nameservers"][0], "10.96.0.10");
    }
}
