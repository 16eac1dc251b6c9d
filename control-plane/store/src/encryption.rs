//! Encryption at rest: a [`Store`] wrapper that encrypts the values of chosen resources
//! (Secrets by default) before they reach the backend and decrypts them on the way back,
//! as upstream's value transformers do. Values are stored as
//! `k8s:enc:aesgcm:v1:<keyname>:<12-byte nonce><ciphertext+tag>` with the storage key as
//! authenticated data; the first provider encrypts new writes, every listed key decrypts,
//! and values without the `k8s:enc:` prefix (written before encryption was turned on) are
//! read as plaintext. Configured by an upstream EncryptionConfiguration file (providers
//! `aesgcm` and `identity`; `aescbc`, `secretbox` and KMS are refused) or a single 32-byte
//! key file (`--encryption-key-file`, raw or base64) for Secrets.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use ring::aead::{AES_128_GCM, AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;

use super::{DynStore, Event, KeyValue, ListResult, Result, Revision, Store, TxnOp, TxnResult};

/// Prefix of every encrypted value (upstream's).
pub const ENC_PREFIX: &[u8] = b"k8s:enc:";
const AESGCM_PREFIX: &str = "k8s:enc:aesgcm:v1:";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing the EncryptionConfiguration")]
    Parse(#[source] serde_saphyr::Error),
    #[error("parsing the {provider} provider")]
    Provider {
        provider: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("key {name}: secret is not valid base64")]
    KeyEncoding {
        name: String,
        #[source]
        source: base64::DecodeError,
    },
    #[error("key {name}: AES-GCM needs a 16- or 32-byte key, got {len} bytes")]
    KeyLength { name: String, len: usize },
    #[error("provider {provider} is not supported (aesgcm and identity are)")]
    Unsupported { provider: String },
    #[error("the EncryptionConfiguration lists no providers for {resources:?}")]
    NoProviders { resources: Vec<String> },
    #[error("encrypting the value of {key}")]
    Seal { key: String },
    #[error("decrypting the value of {key}: {why}")]
    Open { key: String, why: String },
}

/// One AES-GCM key.
struct AesKey {
    name: String,
    key: LessSafeKey,
}

/// How the values of one set of resources are transformed.
pub struct Transformer {
    /// The key new values are encrypted with (`None`: identity first, write plaintext).
    write: Option<usize>,
    keys: Vec<AesKey>,
    rng: SystemRandom,
}

impl Transformer {
    /// One AES-GCM key that encrypts and decrypts.
    pub fn aesgcm(name: &str, secret: &[u8]) -> std::result::Result<Transformer, Error> {
        Ok(Transformer {
            write: Some(0),
            keys: vec![aes_key(name, secret)?],
            rng: SystemRandom::new(),
        })
    }

    pub fn encrypt(&self, store_key: &str, plain: &[u8]) -> std::result::Result<Bytes, Error> {
        let Some(k) = self.write.and_then(|i| self.keys.get(i)) else {
            return Ok(Bytes::copy_from_slice(plain));
        };
        let seal = || Error::Seal { key: store_key.to_string() };
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| seal())?;
        let mut data = plain.to_vec();
        k.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(store_key.as_bytes()),
                &mut data,
            )
            .map_err(|_| seal())?;
        let mut out =
            Vec::with_capacity(AESGCM_PREFIX.len() + k.name.len() + 1 + NONCE_LEN + data.len());
        out.extend_from_slice(AESGCM_PREFIX.as_bytes());
        out.extend_from_slice(k.name.as_bytes());
        out.push(b':');
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&data);
        Ok(Bytes::from(out))
    }

    pub fn decrypt(&self, store_key: &str, stored: &Bytes) -> std::result::Result<Bytes, Error> {
        if !stored.starts_with(ENC_PREFIX) {
            return Ok(stored.clone());
        }
        let fail = |why: &str| Error::Open { key: store_key.to_string(), why: why.to_string() };
        let rest = stored
            .strip_prefix(AESGCM_PREFIX.as_bytes())
            .ok_or_else(|| fail("encrypted by an unsupported provider"))?;
        let colon = rest.iter().position(|b| *b == b':').ok_or_else(|| fail("no key name"))?;
        let name =
            std::str::from_utf8(&rest[..colon]).map_err(|_| fail("key name is not UTF-8"))?;
        let k = self
            .keys
            .iter()
            .find(|k| k.name == name)
            .ok_or_else(|| fail(&format!("no key named {name:?} is configured")))?;
        let body = &rest[colon + 1..];
        if body.len() < NONCE_LEN {
            return Err(fail("value too short"));
        }
        let nonce =
            Nonce::try_assume_unique_for_key(&body[..NONCE_LEN]).map_err(|_| fail("bad nonce"))?;
        let mut data = body[NONCE_LEN..].to_vec();
        let plain = k
            .key
            .open_in_place(nonce, Aad::from(store_key.as_bytes()), &mut data)
            .map_err(|_| fail("authentication failed (wrong key or corrupted value)"))?;
        Ok(Bytes::copy_from_slice(plain))
    }
}

fn aes_key(name: &str, secret: &[u8]) -> std::result::Result<AesKey, Error> {
    let alg = match secret.len() {
        16 => &AES_128_GCM,
        32 => &AES_256_GCM,
        len => return Err(Error::KeyLength { name: name.to_string(), len }),
    };
    let unbound = UnboundKey::new(alg, secret)
        .map_err(|_| Error::KeyLength { name: name.to_string(), len: secret.len() })?;
    Ok(AesKey { name: name.to_string(), key: LessSafeKey::new(unbound) })
}

/// Which store key prefixes are transformed and how.
pub struct EncryptionConfig {
    rules: Vec<(String, Arc<Transformer>)>,
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    resources: Vec<ResourceConfig>,
}

#[derive(Deserialize)]
struct ResourceConfig {
    resources: Vec<String>,
    #[serde(default)]
    providers: Vec<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Deserialize)]
struct KeysConfig {
    #[serde(default)]
    keys: Vec<KeyConfig>,
}

#[derive(Deserialize)]
struct KeyConfig {
    name: String,
    secret: String,
}

/// `secrets` → `/registry/core/secrets/`, `deployments.apps` → `/registry/apps/deployments/`.
fn prefix_of(resource: &str) -> String {
    match resource.split_once('.') {
        Some((plural, group)) if !group.is_empty() => format!("/registry/{group}/{plural}/"),
        _ => format!("/registry/core/{}/", resource.trim_end_matches('.')),
    }
}

impl EncryptionConfig {
    /// Encrypt Secrets with one AES-GCM key read from `path` (32 raw bytes, or base64).
    pub fn from_key_file(path: &Path) -> std::result::Result<EncryptionConfig, Error> {
        let raw = std::fs::read(path)
            .map_err(|source| Error::Read { path: path.display().to_string(), source })?;
        let trimmed = String::from_utf8_lossy(&raw).trim().to_string();
        let key = match base64::engine::general_purpose::STANDARD.decode(&trimmed) {
            Ok(k) if k.len() == 32 || k.len() == 16 => k,
            _ => raw,
        };
        let t = Transformer::aesgcm("key1", &key)?;
        Ok(EncryptionConfig { rules: vec![(prefix_of("secrets"), Arc::new(t))] })
    }

    /// An upstream EncryptionConfiguration (apiserver.config.k8s.io/v1) file.
    pub fn from_file(path: &Path) -> std::result::Result<EncryptionConfig, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> std::result::Result<EncryptionConfig, Error> {
        let file: ConfigFile = serde_saphyr::from_str(text).map_err(Error::Parse)?;
        let mut rules = Vec::new();
        for rc in file.resources {
            let mut write = None;
            let mut keys = Vec::new();
            for (i, p) in rc.providers.iter().enumerate() {
                let Some((name, value)) = p.iter().next() else { continue };
                let provider = name.clone();
                match provider.as_str() {
                    "identity" => {}
                    "aesgcm" => {
                        let kc: KeysConfig =
                            serde_json::from_value(value.clone()).map_err(|source| {
                                Error::Provider { provider: provider.clone(), source }
                            })?;
                        for (j, k) in kc.keys.into_iter().enumerate() {
                            let secret = base64::engine::general_purpose::STANDARD
                                .decode(k.secret.trim())
                                .map_err(|source| Error::KeyEncoding {
                                    name: k.name.clone(),
                                    source,
                                })?;
                            if i == 0 && j == 0 {
                                write = Some(keys.len());
                            }
                            keys.push(aes_key(&k.name, &secret)?);
                        }
                    }
                    _ => return Err(Error::Unsupported { provider }),
                }
            }
            if rc.providers.is_empty() {
                return Err(Error::NoProviders { resources: rc.resources });
            }
            let t = Arc::new(Transformer { write, keys, rng: SystemRandom::new() });
            for r in &rc.resources {
                rules.push((prefix_of(r), t.clone()));
            }
        }
        Ok(EncryptionConfig { rules })
    }

    fn for_key(&self, key: &str) -> Option<&Transformer> {
        self.rules.iter().find(|(p, _)| key.starts_with(p.as_str())).map(|(_, t)| t.as_ref())
    }
}

/// The wrapper store.
pub struct EncryptedStore {
    inner: DynStore,
    config: Arc<EncryptionConfig>,
}

impl EncryptedStore {
    pub fn new(inner: DynStore, config: EncryptionConfig) -> EncryptedStore {
        EncryptedStore { inner, config: Arc::new(config) }
    }
}

fn decrypt_kv(config: &EncryptionConfig, mut kv: KeyValue) -> Result<KeyValue> {
    if let Some(t) = config.for_key(&kv.key) {
        kv.value = t
            .decrypt(&kv.key, &kv.value)
            .map_err(|e| super::Error::backend("decrypting a stored value", e))?;
    }
    Ok(kv)
}

#[async_trait]
impl Store for EncryptedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner.get(key).await?.map(|kv| decrypt_kv(&self.config, kv)).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<ListResult> {
        let mut r = self.inner.list(prefix).await?;
        r.kvs = r.kvs.into_iter().map(|kv| decrypt_kv(&self.config, kv)).collect::<Result<_>>()?;
        Ok(r)
    }

    async fn txn(&self, ops: Vec<TxnOp>) -> Result<Vec<TxnResult>> {
        let seal = |key: &str, value: Bytes| -> Result<Bytes> {
            match self.config.for_key(key) {
                Some(t) => t
                    .encrypt(key, &value)
                    .map_err(|e| super::Error::backend("encrypting a value", e)),
                None => Ok(value),
            }
        };
        let ops = ops
            .into_iter()
            .map(|op| {
                Ok(match op {
                    TxnOp::Create { value, key } => {
                        TxnOp::Create { value: seal(&key, value)?, key }
                    }
                    TxnOp::Update { key, value, expected } => {
                        TxnOp::Update { value: seal(&key, value)?, key, expected }
                    }
                    d @ TxnOp::Delete { .. } => d,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.inner
            .txn(ops)
            .await?
            .into_iter()
            .map(|r| {
                Ok(match r {
                    TxnResult::Put(kv) => TxnResult::Put(decrypt_kv(&self.config, kv)?),
                    TxnResult::Deleted(kv) => TxnResult::Deleted(decrypt_kv(&self.config, kv)?),
                })
            })
            .collect()
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.inner.current_revision().await
    }

    fn needs_reopen(&self) -> Option<String> {
        self.inner.needs_reopen()
    }

    async fn check_health(&self) -> Result<()> {
        self.inner.check_health().await
    }

    async fn watch(
        &self,
        prefix: &str,
        after: Revision,
    ) -> Result<BoxStream<'static, Result<Event>>> {
        let config = self.config.clone();
        let stream = self.inner.watch(prefix, after).await?;
        Ok(stream
            .map(move |ev| {
                let mut ev = ev?;
                ev.kv = decrypt_kv(&config, ev.kv)?;
                ev.prev = ev.prev.map(|kv| decrypt_kv(&config, kv)).transpose()?;
                Ok(ev)
            })
            .boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.compact(revision).await
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.inner.compacted_revision().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreExt;
    use crate::memory::MemoryStore;

    const KEY32: &str = "c2tpZmYtdGVzdC1rZXktMzItYnl0ZXMtbG9uZy4uLi4="; // 32 bytes

    fn config() -> EncryptionConfig {
        EncryptionConfig::parse(&format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets]\n    providers:\n      - aesgcm:\n          keys:\n            - name: key1\n              secret: {KEY32}\n      - identity: {{}}\n"
        ))
        .expect("config")
    }

    #[tokio::test]
    async fn secrets_are_sealed_others_untouched_and_plaintext_still_reads() {
        let raw: DynStore = Arc::new(MemoryStore::new());
        // Written before encryption was turned on.
        raw.create("/registry/core/secrets/default/old", Bytes::from_static(b"{\"old\":1}"))
            .await
            .unwrap();
        let store = EncryptedStore::new(raw.clone(), config());
        store
            .create(
                "/registry/core/secrets/default/s",
                Bytes::from_static(b"{\"data\":\"hunter2\"}"),
            )
            .await
            .unwrap();
        store
            .create(
                "/registry/core/configmaps/default/c",
                Bytes::from_static(b"{\"data\":\"open\"}"),
            )
            .await
            .unwrap();
        let sealed = raw.get("/registry/core/secrets/default/s").await.unwrap().unwrap();
        assert!(sealed.value.starts_with(b"k8s:enc:aesgcm:v1:key1:"));
        assert!(!sealed.value.windows(7).any(|w| w == b"hunter2"));
        let cm = raw.get("/registry/core/configmaps/default/c").await.unwrap().unwrap();
        assert_eq!(&cm.value[..], b"{\"data\":\"open\"}");
        let s = store.get("/registry/core/secrets/default/s").await.unwrap().unwrap();
        assert_eq!(&s.value[..], b"{\"data\":\"hunter2\"}");
        let old = store.get("/registry/core/secrets/default/old").await.unwrap().unwrap();
        assert_eq!(&old.value[..], b"{\"old\":1}");
        let listed = store.list("/registry/core/secrets/").await.unwrap();
        assert!(listed.kvs.iter().all(|kv| !kv.value.starts_with(ENC_PREFIX)));
        // The storage key is authenticated: a value moved to another key does not open.
        raw.create("/registry/core/secrets/default/moved", sealed.value.clone()).await.unwrap();
        assert!(store.get("/registry/core/secrets/default/moved").await.is_err());
        // Watches see plaintext.
        let mut w = store.watch("/registry/core/secrets/", 0).await.unwrap();
        let first = w.next().await.unwrap().unwrap();
        assert!(!first.kv.value.starts_with(ENC_PREFIX));
    }

    #[test]
    fn unsupported_providers_and_bad_keys_are_refused() {
        let cfg = "resources:\n  - resources: [secrets]\n    providers:\n      - secretbox:\n          keys: []\n";
        assert!(matches!(EncryptionConfig::parse(cfg), Err(Error::Unsupported { .. })));
        let cfg = "resources:\n  - resources: [secrets]\n    providers:\n      - aesgcm:\n          keys:\n            - name: k\n              secret: c2hvcnQ=\n";
        assert!(matches!(EncryptionConfig::parse(cfg), Err(Error::KeyLength { .. })));
        assert_eq!(prefix_of("deployments.apps"), "/registry/apps/deployments/");
    }
}
