//! The embedded default backend (placeholder until the redb backend lands: in memory).

use std::path::Path;

use super::memory::MemoryStore;

pub type EmbeddedStore = MemoryStore;

impl MemoryStore {
    pub async fn open(_dir: &Path) -> super::Result<MemoryStore> {
        Ok(MemoryStore::new())
    }
}
