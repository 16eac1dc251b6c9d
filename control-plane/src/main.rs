//! skiff-server: the control-plane binary.

fn main() -> anyhow::Result<()> {
    Ok(())
}
