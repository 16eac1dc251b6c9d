//! The network configuration skiff-cni reads on stdin, and its validation.

use std::path::PathBuf;

use cni_plugin::config::NetworkConfig;
use ipnetwork::Ipv4Network;
use serde::Deserialize;
use serde_json::Value;

/// CNI spec versions this plugin speaks, oldest first.
pub const SUPPORTED_VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

/// Where IPAM state lives when `dataDir` is not given (beside libcni's own
/// `/var/lib/cni`, as host-local's `/var/lib/cni/networks`).
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/skiff";

/// Default MTU: Ethernet's. The agent writes a lower one (1450) in VXLAN mode.
pub const DEFAULT_MTU: u32 = 1500;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("decoding the network configuration JSON")]
    Decode(#[source] serde_json::Error),
    #[error("invalid network configuration: {0}")]
    Invalid(String),
    #[error("unsupported cniVersion {0:?} (supported: 0.4.0, 1.0.0, 1.1.0)")]
    IncompatibleVersion(String),
    /// The conflist names a node file ([`NODE_CONFIG_FIELD`]) that is not there yet: the
    /// node agent writes it once the Node has `spec.podCIDR` (CNI code 11, try again).
    #[error(
        "this node has no pod CIDR yet: {0} is missing (skiff-agent writes it once the Node has spec.podCIDR)"
    )]
    NoPodCidrYet(PathBuf),
}

/// The conflist field naming the node file the pod CIDR (and MTU) are read from at each
/// call, for a conflist written before the node had a pod CIDR (a DaemonSet's init
/// container, as flannel's `subnet.env`).
pub const NODE_CONFIG_FIELD: &str = "nodeConfig";

/// Where the node agent keeps the node file by default.
pub const DEFAULT_NODE_CONFIG: &str = "/run/skiff/cni/node.json";

/// The node file: what only the node agent knows, written by it (atomically) once the
/// Node has a pod CIDR.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    #[serde(rename = "podCIDR")]
    pub pod_cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

impl NodeConfig {
    /// Reads a node file; a missing one is [`Error::NoPodCidrYet`].
    pub fn read(path: &std::path::Path) -> Result<Self> {
        let body = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NoPodCidrYet(path.to_path_buf()));
            }
            Err(e) => return Err(Error::Invalid(format!("reading {}: {e}", path.display()))),
        };
        serde_json::from_slice(&body)
            .map_err(|e| Error::Invalid(format!("node file {}: {e}", path.display())))
    }

    /// Writes a node file atomically (a plugin call reads the old file or the new one).
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec(self).unwrap_or_default())?;
        std::fs::rename(&tmp, path)
    }
}

/// The fields specific to skiff-cni (unknown fields are ignored, as the spec requires).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SkiffFields {
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    node_config: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    mtu: Option<u32>,
}

/// One valid attachment from a GC request (`cni.dev/valid-attachments`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// A validated skiff-cni network configuration.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The requested spec version (one of [`SUPPORTED_VERSIONS`]).
    pub cni_version: String,
    /// The network name (names the IPAM store directory).
    pub name: String,
    /// This node's pod CIDR: pod addresses are taken from it.
    pub pod_cidr: Ipv4Network,
    /// IPAM state directory (one sub-directory per network name).
    pub data_dir: PathBuf,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// `prevResult`, for CHECK.
    pub prev_result: Option<Value>,
    /// `cni.dev/valid-attachments`, for GC.
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// The `cniVersion` of a payload if it has one, for stamping error replies.
pub fn peek_version(payload: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    v.get("cniVersion")?.as_str().map(str::to_owned)
}

/// Checks a requested spec version against [`SUPPORTED_VERSIONS`].
pub fn check_version(version: &str) -> Result<()> {
    if SUPPORTED_VERSIONS.contains(&version) {
        Ok(())
    } else {
        Err(Error::IncompatibleVersion(version.to_owned()))
    }
}

impl PluginConfig {
    /// Parses and validates a network configuration: JSON errors are [`Error::Decode`]
    /// (CNI code 6), an unknown version [`Error::IncompatibleVersion`] (1), anything
    /// semantically wrong [`Error::Invalid`] (7).
    pub fn parse(payload: &[u8]) -> Result<Self> {
        Self::parse_with(payload, false)
    }

    /// As [`Self::parse`], for DEL: a node file not written yet is no error there (DEL
    /// releases by container ID and never consults the range, and a runtime must be able
    /// to tear a sandbox down whatever the node's state), the range left as `0.0.0.0/0`.
    pub fn parse_for_del(payload: &[u8]) -> Result<Self> {
        Self::parse_with(payload, true)
    }

    fn parse_with(payload: &[u8], del: bool) -> Result<Self> {
        let raw: Value = serde_json::from_slice(payload).map_err(Error::Decode)?;
        let version = raw
            .get("cniVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Invalid("cniVersion missing or not a string".into()))?;
        check_version(version)?;
        let common: NetworkConfig = serde_json::from_value(raw.clone())
            .map_err(|e| Error::Invalid(format!("network configuration: {e}")))?;
        if common.plugin != "skiff-cni" {
            return Err(Error::Invalid(format!(
                "type is {:?}, expected \"skiff-cni\"",
                common.plugin
            )));
        }
        if common.name.is_empty() || common.name.contains('/') || common.name.starts_with('.') {
            return Err(Error::Invalid(format!("invalid network name {:?}", common.name)));
        }
        let mut fields: SkiffFields = serde_json::from_value(raw.clone())
            .map_err(|e| Error::Invalid(format!("skiff-cni fields: {e}")))?;
        // An inline podCIDR wins; otherwise the node file's (its MTU only when the conflist
        // sets none).
        if fields.pod_cidr.is_none()
            && let Some(path) = &fields.node_config
        {
            match NodeConfig::read(path) {
                Ok(node) => {
                    fields.pod_cidr = Some(node.pod_cidr);
                    fields.mtu = fields.mtu.or(node.mtu);
                }
                Err(Error::NoPodCidrYet(_)) if del => fields.pod_cidr = Some("0.0.0.0/0".into()),
                Err(e) => return Err(e),
            }
        }
        let pod_cidr = fields
            .pod_cidr
            .ok_or_else(|| Error::Invalid("podCIDR missing (and no nodeConfig file)".into()))?;
        let pod_cidr: Ipv4Network =
            pod_cidr.parse().map_err(|e| Error::Invalid(format!("podCIDR {pod_cidr:?}: {e}")))?;
        if pod_cidr.prefix() > 30 {
            return Err(Error::Invalid(format!(
                "podCIDR {pod_cidr} is smaller than a /30: no pod address fits"
            )));
        }
        if pod_cidr.network() != pod_cidr.ip() {
            return Err(Error::Invalid(format!(
                "podCIDR {pod_cidr} has host bits set (network is {})",
                pod_cidr.network()
            )));
        }
        let mtu = fields.mtu.unwrap_or(DEFAULT_MTU);
        if !(576..=65535).contains(&mtu) {
            return Err(Error::Invalid(format!("mtu {mtu} outside 576..=65535")));
        }
        let valid_attachments = match raw.get("cni.dev/valid-attachments") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                serde_json::from_value(v.clone())
                    .map_err(|e| Error::Invalid(format!("cni.dev/valid-attachments: {e}")))?,
            ),
        };
        Ok(Self {
            cni_version: version.to_owned(),
            name: common.name,
            pod_cidr,
            data_dir: fields.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            mtu,
            prev_result: common.prev_result,
            valid_attachments,
        })
    }

    /// The IPAM store directory of this network.
    pub fn network_dir(&self) -> PathBuf {
        self.data_dir.join("networks").join(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<PluginConfig> {
        PluginConfig::parse(s.as_bytes())
    }

    #[test]
    fn parses_a_full_config_and_ignores_unknown_fields() {
        let c = parse(
            r#"{"cniVersion":"1.1.0","name":"skiff","type":"skiff-cni","podCIDR":"10.244.1.0/24",
                "dataDir":"/tmp/x","mtu":1450,"somethingElse":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!(c.pod_cidr.to_string(), "10.244.1.0/24");
        assert_eq!(c.mtu, 1450);
        assert_eq!(c.network_dir(), PathBuf::from("/tmp/x/networks/skiff"));
    }

    #[test]
    fn defaults_apply() {
        let c = parse(
            r#"{"cniVersion":"0.4.0","name":"n","type":"skiff-cni","podCIDR":"10.1.0.0/16"}"#,
        )
        .unwrap();
        assert_eq!(c.mtu, DEFAULT_MTU);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }

    #[test]
    fn errors_are_classified() {
        assert!(matches!(parse("{not json"), Err(Error::Decode(_))));
        assert!(matches!(
            parse(
                r#"{"cniVersion":"0.3.1","name":"n","type":"skiff-cni","podCIDR":"10.1.0.0/16"}"#
            ),
            Err(Error::IncompatibleVersion(_))
        ));
        for bad in [
            r#"{"cniVersion":"1.0.0","name":"n","type":"skiff-cni"}"#,
            r#"{"cniVersion":"1.0.0","name":"n","type":"skiff-cni","podCIDR":"10.1.0.0/33"}"#,
            r#"{"cniVersion":"1.0.0","name":"n","type":"skiff-cni","podCIDR":"banana"}"#,
            r#"{"cniVersion":"1.0.0","name":"n","type":"skiff-cni","podCIDR":"10.1.0.1/16"}"#,
            r#"{"cniVersion":"1.0.0","name":"n","type":"bridge","podCIDR":"10.1.0.0/16"}"#,
            r#"{"cniVersion":"1.0.0","type":"skiff-cni","podCIDR":"10.1.0.0/16"}"#,
            r#"{"cniVersion":"1.0.0","name":"n","type":"skiff-cni","podCIDR":"10.1.0.0/16","mtu":10}"#,
        ] {
            assert!(matches!(parse(bad), Err(Error::Invalid(_))), "{bad}");
        }
    }
}
