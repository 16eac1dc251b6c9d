//! [`Auth`], the runtime form of the authentication settings: the parsed ServiceAccount
//! signing keys, the static token table and the authorizers; and the errors of loading them.
//! Below the authenticators that read it.

use std::path::PathBuf;
use std::sync::Arc;

use jsonwebtoken::{DecodingKey, EncodingKey};

use crate::authz::Authorizer;
use crate::config::{AuthConfig, DEFAULT_ISSUER};
use crate::user::UserInfo;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the token file {path}")]
    ReadTokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    TokenFileLine { path: PathBuf, line: usize, message: String },
    #[error("loading the service account key")]
    ServiceAccountKey(#[source] jsonwebtoken::errors::Error),
}

/// The runtime form of [`AuthConfig`]: parsed keys and token tables.
pub struct Auth {
    pub config: AuthConfig,
    pub sa: Option<Keys>,
    pub static_tokens: std::collections::HashMap<String, UserInfo>,
    /// The authorizers, shared with the admission plugin that checks RBAC escalation.
    pub authz: Arc<Authorizer>,
}

impl Auth {
    pub fn new(config: AuthConfig) -> Result<Auth, Error> {
        let sa = if config.sa_key_pem.is_empty() {
            // No configured key (an in-process apiserver): an ephemeral one, so TokenRequest
            // works as it does on a real server; its tokens die with the process.
            match rcgen::KeyPair::generate() {
                Ok(key) => Some(Keys::new(&key.serialize_pem(), &key.public_key_pem())?),
                Err(e) => {
                    tracing::warn!(error = %e, "no ServiceAccount signing key: TokenRequest disabled");
                    None
                }
            }
        } else {
            Some(Keys::new(&config.sa_key_pem, &config.sa_pub_pem)?)
        };
        let static_tokens =
            config.static_tokens.iter().map(|t| (t.token.clone(), t.user.clone())).collect();
        let authz = Arc::new(Authorizer::new(config.authorization));
        Ok(Auth { config, sa, static_tokens, authz })
    }

    pub fn issuer(&self) -> &str {
        if self.config.issuer.is_empty() { DEFAULT_ISSUER } else { &self.config.issuer }
    }

    pub fn audiences(&self) -> Vec<String> {
        if self.config.audiences.is_empty() {
            vec![self.issuer().to_string()]
        } else {
            self.config.audiences.clone()
        }
    }
}

/// The parsed signing and verification keys.
pub struct Keys {
    pub(super) encoding: EncodingKey,
    pub(super) decoding: DecodingKey,
    pub(super) kid: String,
}

impl Keys {
    pub fn new(private_pem: &str, public_pem: &str) -> Result<Keys, Error> {
        let encoding =
            EncodingKey::from_ec_pem(private_pem.as_bytes()).map_err(Error::ServiceAccountKey)?;
        let decoding =
            DecodingKey::from_ec_pem(public_pem.as_bytes()).map_err(Error::ServiceAccountKey)?;
        // Key id: a digest of the public key, as upstream derives it from the key's DER.
        let digest = ring::digest::digest(&ring::digest::SHA256, public_pem.as_bytes());
        let kid = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            &digest.as_ref()[..16],
        );
        Ok(Keys { encoding, decoding, kid })
    }
}
