//! Masquerade (source NAT to the node's address) for pod traffic leaving the cluster CIDR,
//! so pods reach beyond the node while pod-to-pod traffic keeps its addresses.
//!
//! Implemented with nftables through the `nft` binary (Debian package `nftables`): one
//! table `ip skiff` owned entirely by skiff, with a `postrouting` NAT chain. Applying
//! replaces the whole table in one atomic `nft -f` transaction, so it is idempotent and
//! never leaves a half-written rule set; removing deletes the table. `nft` acts in the
//! network namespace of the calling thread (see [`crate::netns::run_in`]).

use std::io::{self, Write};
use std::process::{Command, Stdio};

use ipnetwork::Ipv4Network;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("running nft (is the nftables package installed?)")]
    Spawn(#[source] io::Error),
    #[error("nft rejected the {step}: {stderr}")]
    Nft { step: &'static str, stderr: String },
}

/// The masquerade rule set of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masquerade {
    /// The pod network: traffic from it to outside it is masqueraded.
    pub cluster_cidr: Ipv4Network,
    /// Destinations never masqueraded besides the cluster CIDR (ip-masq-agent's
    /// `nonMasqueradeCIDRs`); empty by default.
    pub except: Vec<Ipv4Network>,
    /// nftables table name (family `ip`), default `skiff`.
    pub table: String,
}

impl Masquerade {
    pub fn new(cluster_cidr: Ipv4Network) -> Self {
        Self { cluster_cidr, except: Vec::new(), table: "skiff".into() }
    }

    pub fn except(mut self, cidr: Ipv4Network) -> Self {
        self.except.push(cidr);
        self
    }

    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// The `nft -f` script that (re)creates the table atomically.
    pub fn script(&self) -> String {
        let t = &self.table;
        let mut skip = vec![self.cluster_cidr.to_string()];
        skip.extend(self.except.iter().map(ToString::to_string));
        format!(
            "table ip {t} {{}}\ndelete table ip {t}\ntable ip {t} {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    ip saddr {cluster} ip daddr != {{ {skip} }} masquerade\n  }}\n}}\n",
            cluster = self.cluster_cidr,
            skip = skip.join(", "),
        )
    }

    /// Installs (or replaces) the rule set. Idempotent.
    #[tracing::instrument(skip_all, fields(cluster_cidr = %self.cluster_cidr, table = %self.table))]
    pub fn apply(&self) -> Result<()> {
        nft(&self.script(), "masquerade rule set")
    }

    /// Removes the table; removing what is not there is success.
    #[tracing::instrument(skip_all, fields(table = %self.table))]
    pub fn remove(&self) -> Result<()> {
        let t = &self.table;
        nft(&format!("table ip {t} {{}}\ndelete table ip {t}\n"), "table removal")
    }
}

fn nft(script: &str, step: &'static str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Error::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(Error::Spawn)?;
    }
    let out = child.wait_with_output().map_err(Error::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Nft { step, stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_replaces_the_table_atomically() {
        let m = Masquerade::new("10.244.0.0/16".parse().unwrap())
            .except("192.168.0.0/16".parse().unwrap());
        let s = m.script();
        assert!(s.starts_with("table ip skiff {}\ndelete table ip skiff\n"));
        assert!(s.contains(
            "ip saddr 10.244.0.0/16 ip daddr != { 10.244.0.0/16, 192.168.0.0/16 } masquerade"
        ));
    }
}
