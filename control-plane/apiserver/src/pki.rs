//! The cluster's PKI: a CA, the apiserver's serving certificate, the admin client
//! certificate and the apiserver's client certificate towards the agents (logs, exec), generated on first start under the data dir and reused afterwards, plus the
//! admin kubeconfig that kubectl uses as is.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("generating {what}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("reading or writing {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loading {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("configuring TLS")]
    Tls(#[source] rustls::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The common name of the apiserver's client certificate towards the agents' streaming
/// endpoints (upstream's apiserver-kubelet-client); the agents serve only this name
/// (skiff-agent's `streaming::APISERVER_CLIENT_CN`, the same string).
pub const KUBELET_CLIENT_CN: &str = "skiff-apiserver";

/// PEM files under `<data-dir>/pki`.
pub struct Pki {
    pub dir: PathBuf,
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    /// The apiserver's client certificate for the agents (CN [`KUBELET_CLIENT_CN`]).
    pub kubelet_client_cert_pem: String,
    pub kubelet_client_key_pem: String,
    /// ServiceAccount token signing key (PKCS#8 EC P-256) and its public key (SPKI).
    pub sa_key_pem: String,
    pub sa_pub_pem: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

fn gen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Generate { what, source }
}

impl Pki {
    /// Load the PKI from `data_dir/pki`, creating what is missing. `hosts` are extra names
    /// and addresses for the serving certificate (the listen address, the node's IPs).
    pub fn load_or_create(data_dir: &Path, hosts: &[String]) -> Result<Pki> {
        let dir = data_dir.join("pki");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let (ca_cert_pem, ca_key_pem) = match (read("ca.crt"), read("ca.key")) {
            (Some(c), Some(k)) => (c, k),
            _ => {
                let key = KeyPair::generate().map_err(gen_err("the CA key"))?;
                let mut params =
                    CertificateParams::new(Vec::<String>::new()).map_err(gen_err("the CA"))?;
                params.distinguished_name.push(DnType::CommonName, "skiff-ca");
                params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
                params.key_usages = vec![
                    KeyUsagePurpose::KeyCertSign,
                    KeyUsagePurpose::CrlSign,
                    KeyUsagePurpose::DigitalSignature,
                ];
                params.not_after = rcgen::date_time_ymd(2036, 1, 1);
                let cert = params.self_signed(&key).map_err(gen_err("the CA"))?;
                write_private(&dir.join("ca.key"), &key.serialize_pem())?;
                write(&dir.join("ca.crt"), &cert.pem())?;
                (cert.pem(), key.serialize_pem())
            }
        };
        let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(gen_err("loading the CA key"))?;
        let issuer =
            Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key).map_err(gen_err("loading the CA"))?;

        let (server_cert_pem, server_key_pem) = match (read("apiserver.crt"), read("apiserver.key"))
        {
            (Some(c), Some(k)) => (c, k),
            _ => {
                let mut names: Vec<String> = vec![
                    "localhost".into(),
                    "kubernetes".into(),
                    "kubernetes.default".into(),
                    "kubernetes.default.svc".into(),
                    "kubernetes.default.svc.cluster.local".into(),
                ];
                names.extend(hosts.iter().filter(|h| h.parse::<IpAddr>().is_err()).cloned());
                let mut params =
                    CertificateParams::new(names).map_err(gen_err("the serving certificate"))?;
                let mut ips: Vec<IpAddr> =
                    vec!["127.0.0.1".parse().expect("ip"), "10.96.0.1".parse().expect("ip")];
                ips.extend(hosts.iter().filter_map(|h| h.parse::<IpAddr>().ok()));
                for ip in ips {
                    params.subject_alt_names.push(SanType::IpAddress(ip));
                }
                params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                params.not_after = rcgen::date_time_ymd(2036, 1, 1);
                let key = KeyPair::generate().map_err(gen_err("the serving key"))?;
                let cert =
                    params.signed_by(&key, &issuer).map_err(gen_err("the serving certificate"))?;
                write_private(&dir.join("apiserver.key"), &key.serialize_pem())?;
                write(&dir.join("apiserver.crt"), &cert.pem())?;
                (cert.pem(), key.serialize_pem())
            }
        };
        let (admin_cert_pem, admin_key_pem) = match (read("admin.crt"), read("admin.key")) {
            (Some(c), Some(k)) => (c, k),
            _ => {
                let (c, k) = client_cert(&issuer, "kubernetes-admin", &["system:masters"])?;
                write_private(&dir.join("admin.key"), &k)?;
                write(&dir.join("admin.crt"), &c)?;
                (c, k)
            }
        };
        let (kubelet_client_cert_pem, kubelet_client_key_pem) =
            match (read("apiserver-kubelet-client.crt"), read("apiserver-kubelet-client.key")) {
                (Some(c), Some(k)) => (c, k),
                _ => {
                    let (c, k) = client_cert(&issuer, KUBELET_CLIENT_CN, &["system:masters"])?;
                    write_private(&dir.join("apiserver-kubelet-client.key"), &k)?;
                    write(&dir.join("apiserver-kubelet-client.crt"), &c)?;
                    (c, k)
                }
            };
        let (sa_key_pem, sa_pub_pem) = match (read("sa.key"), read("sa.pub")) {
            (Some(k), Some(p)) => (k, p),
            _ => {
                let key = KeyPair::generate().map_err(gen_err("the service account key"))?;
                write_private(&dir.join("sa.key"), &key.serialize_pem())?;
                write(&dir.join("sa.pub"), &key.public_key_pem())?;
                (key.serialize_pem(), key.public_key_pem())
            }
        };
        Ok(Pki {
            dir,
            sa_key_pem,
            sa_pub_pem,
            ca_cert_pem,
            ca_key_pem,
            server_cert_pem,
            server_key_pem,
            admin_cert_pem,
            admin_key_pem,
            kubelet_client_cert_pem,
            kubelet_client_key_pem,
        })
    }

    /// A new client certificate signed by the CA (CN = user, O = groups).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<(String, String)> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem).map_err(gen_err("loading the CA key"))?;
        let issuer = Issuer::from_ca_cert_pem(&self.ca_cert_pem, ca_key)
            .map_err(gen_err("loading the CA"))?;
        client_cert(&issuer, user, groups)
    }

    /// A kubeconfig for `server` authenticating with the given client certificate.
    pub fn kubeconfig(&self, server: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: skiff\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: {user}@skiff\n  context:\n    cluster: skiff\n    user: {user}\ncurrent-context: {user}@skiff\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n",
            ca = b64(&self.ca_cert_pem),
            cert = b64(cert_pem),
            key = b64(key_pem),
        )
    }

    /// Write `<data-dir>/admin.kubeconfig` for `server`.
    pub fn write_admin_kubeconfig(&self, path: &Path, server: &str) -> Result<()> {
        let cfg = self.kubeconfig(server, "admin", &self.admin_cert_pem, &self.admin_key_pem);
        write_private(path, &cfg)
    }

    /// rustls server config: the serving certificate; client certificates from the CA are
    /// verified when presented (authentication is enforced in a later stage).
    pub fn server_config(&self) -> Result<rustls::ServerConfig> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.server_cert_pem.as_bytes())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Load {
                    path: self.dir.join("apiserver.crt"),
                    message: e.to_string(),
                })?;
        let key = PrivateKeyDer::from_pem_slice(self.server_key_pem.as_bytes()).map_err(|e| {
            Error::Load { path: self.dir.join("apiserver.key"), message: e.to_string() }
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(self.ca_cert_pem.as_bytes()) {
            let ca = ca.map_err(|e| Error::Load {
                path: self.dir.join("ca.crt"),
                message: e.to_string(),
            })?;
            roots.add(ca).map_err(Error::Tls)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| Error::Load { path: self.dir.join("ca.crt"), message: e.to_string() })?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(Error::Tls)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(Error::Tls)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(cfg)
    }

    /// rustls client config for the agents' streaming endpoints: the apiserver's client
    /// certificate, HTTP/1.1 (upgrades), and no verification of the agents' self-signed
    /// serving certificates (upstream's default without --kubelet-certificate-authority).
    pub fn kubelet_client_config(&self) -> Result<rustls::ClientConfig> {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.kubelet_client_cert_pem.as_bytes())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Load {
                    path: self.dir.join("apiserver-kubelet-client.crt"),
                    message: e.to_string(),
                })?;
        let key =
            PrivateKeyDer::from_pem_slice(self.kubelet_client_key_pem.as_bytes()).map_err(|e| {
                Error::Load {
                    path: self.dir.join("apiserver-kubelet-client.key"),
                    message: e.to_string(),
                }
            })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(Error::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(UnverifiedServer(provider)))
            .with_client_auth_cert(certs, key)
            .map_err(Error::Tls)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

/// Accepts any serving certificate (signatures of the handshake are still checked).
#[derive(Debug)]
struct UnverifiedServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for UnverifiedServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Sign a PEM certificate signing request as a client certificate for `user` in
/// `groups`: the subject the requester asked for is ignored, only its public key is used.
pub fn sign_client_csr(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    csr_pem: &str,
    user: &str,
    groups: &[&str],
    valid_days: i64,
) -> Result<String> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(gen_err("loading the CA key"))?;
    let issuer =
        Issuer::from_ca_cert_pem(ca_cert_pem, ca_key).map_err(gen_err("loading the CA"))?;
    let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(gen_err("parsing the certificate signing request"))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(gen_err("a client certificate"))?;
    params.distinguished_name.push(DnType::CommonName, user);
    for g in groups {
        params.distinguished_name.push(DnType::OrganizationName, *g);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let now = unix_now();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + std::time::Duration::from_secs(now.saturating_sub(300));
    params.not_after =
        epoch + std::time::Duration::from_secs(now + valid_days.max(1) as u64 * 86_400);
    csr.params = params;
    let cert = csr.signed_by(&issuer).map_err(gen_err("a node client certificate"))?;
    Ok(cert.pem())
}

fn client_cert(
    issuer: &Issuer<'_, KeyPair>,
    user: &str,
    groups: &[&str],
) -> Result<(String, String)> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(gen_err("a client certificate"))?;
    params.distinguished_name.push(DnType::CommonName, user);
    for g in groups {
        params.distinguished_name.push(DnType::OrganizationName, *g);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    let key = KeyPair::generate().map_err(gen_err("a client key"))?;
    let cert = params.signed_by(&key, issuer).map_err(gen_err("a client certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn write(path: &Path, content: &str) -> Result<()> {
    std::fs::write(path, content).map_err(io(path))
}

fn write_private(path: &Path, content: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(content.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}
