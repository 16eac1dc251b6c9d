//! skiff-agent: joins a cluster and runs its node's pods.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("skiff-agent: not built yet")
}
