//! The etcd v3 backend (placeholder until it lands).

use super::memory::MemoryStore;

pub type EtcdStore = MemoryStore;

impl MemoryStore {
    pub async fn connect(_endpoints: &[String], _prefix: &str) -> super::Result<MemoryStore> {
        Err(super::Error::Closed)
    }
}
