//! The cluster's PKI: a CA, the apiserver's serving certificate, the admin client
//! certificate and the apiserver's client certificate towards the agents (logs, exec), the
//! front proxy's own CA and client certificate (the identity requests proxied to extension
//! apiservers arrive with), generated on first start under the data dir and reused
//! afterwards, plus the admin kubeconfig that kubectl uses as is.

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
    /// The request-header CA (upstream's front-proxy-ca, `--requestheader-client-ca-file`):
    /// apart from the cluster CA, so that no ordinary client certificate can pass as the
    /// front proxy.
    pub front_proxy_ca_cert_pem: String,
    /// The aggregator's client certificate towards extension apiservers (CN
    /// [`FRONT_PROXY_CLIENT_CN`], `--proxy-client-cert-file`), signed by that CA.
    pub front_proxy_client_cert_pem: String,
    pub front_proxy_client_key_pem: String,
}

/// The common name of the front proxy's client certificate, which extension apiservers
/// accept as `requestheader-allowed-names` (kubeadm's `front-proxy-client`).
pub const FRONT_PROXY_CLIENT_CN: &str = "front-proxy-client";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}

fn gen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> Error {
    move |source| Error::Generate { what, source }
}

/// The certificate (or public key) and private key stored as `cert` and `key` in `dir`,
/// or, when either is missing, a new pair from `make`, written there (the key private).
fn kept_pair(
    dir: &Path,
    cert: &str,
    key: &str,
    make: impl FnOnce() -> Result<(String, String)>,
) -> Result<(String, String)> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    if let (Some(c), Some(k)) = (read(cert), read(key)) {
        return Ok((c, k));
    }
    let (c, k) = make()?;
    write_private(&dir.join(key), &k)?;
    write(&dir.join(cert), &c)?;
    Ok((c, k))
}

impl Pki {
    /// Load the PKI from `data_dir/pki`, creating what is missing. `hosts` are extra names
    /// and addresses for the serving certificate (the listen address, the node's IPs,
    /// `--tls-san`): a serving certificate that lacks one of them is issued again, with the
    /// same key and every name it had, as k3s does when a SAN is added.
    pub fn load_or_create(data_dir: &Path, hosts: &[String]) -> Result<Pki> {
        let dir = data_dir.join("pki");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let (ca_cert_pem, ca_key_pem) = kept_pair(&dir, "ca.crt", "ca.key", || {
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
            Ok((cert.pem(), key.serialize_pem()))
        })?;
        let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(gen_err("loading the CA key"))?;
        let issuer =
            Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key).map_err(gen_err("loading the CA"))?;

        let (server_cert_pem, server_key_pem) =
            serving_cert(&dir, &issuer, read("apiserver.crt"), read("apiserver.key"), hosts)?;
        let (admin_cert_pem, admin_key_pem) = kept_pair(&dir, "admin.crt", "admin.key", || {
            client_cert(&issuer, "kubernetes-admin", &["system:masters"])
        })?;
        let (kubelet_client_cert_pem, kubelet_client_key_pem) = kept_pair(
            &dir,
            "apiserver-kubelet-client.crt",
            "apiserver-kubelet-client.key",
            || client_cert(&issuer, KUBELET_CLIENT_CN, &["system:masters"]),
        )?;
        let (sa_pub_pem, sa_key_pem) = kept_pair(&dir, "sa.pub", "sa.key", || {
            let key = KeyPair::generate().map_err(gen_err("the service account key"))?;
            Ok((key.public_key_pem(), key.serialize_pem()))
        })?;
        let (front_proxy_ca_cert_pem, front_proxy_ca_key_pem) =
            kept_pair(&dir, "front-proxy-ca.crt", "front-proxy-ca.key", || {
                ca_cert("front-proxy-ca")
            })?;
        let (front_proxy_client_cert_pem, front_proxy_client_key_pem) =
            kept_pair(&dir, "front-proxy-client.crt", "front-proxy-client.key", || {
                let key = KeyPair::from_pem(&front_proxy_ca_key_pem)
                    .map_err(gen_err("loading the front proxy CA key"))?;
                let issuer = Issuer::from_ca_cert_pem(&front_proxy_ca_cert_pem, key)
                    .map_err(gen_err("loading the front proxy CA"))?;
                client_cert(&issuer, FRONT_PROXY_CLIENT_CN, &[])
            })?;
        Ok(Pki {
            front_proxy_ca_cert_pem,
            front_proxy_client_cert_pem,
            front_proxy_client_key_pem,
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

/// The names and addresses every serving certificate holds: loopback and the names (and
/// the first ClusterIP of the default range) of the `kubernetes` Service.
const BUILTIN_SANS: &[&str] = &[
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "127.0.0.1",
    "10.96.0.1",
];

/// The DNS names and IP addresses in a PEM certificate's subjectAltName, as strings.
pub fn cert_sans(cert_pem: &str) -> Option<Vec<String>> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(d) => out.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                    4 => out.push(IpAddr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                    16 => out.push(IpAddr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Some(out)
}

/// A SAN in canonical form: IP addresses as `IpAddr` prints them, names lower-case.
fn canonical_san(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.trim().trim_end_matches('.').to_ascii_lowercase(),
    }
}

/// The serving certificate: the one on disk when it names every host wanted, else one
/// issued (with the key on disk, when there is one) for the union of both.
fn serving_cert(
    dir: &Path,
    issuer: &Issuer<'_, KeyPair>,
    cert_pem: Option<String>,
    key_pem: Option<String>,
    hosts: &[String],
) -> Result<(String, String)> {
    let mut wanted: Vec<String> = BUILTIN_SANS.iter().map(|s| s.to_string()).collect();
    for h in hosts.iter().map(|h| canonical_san(h)).filter(|h| !h.is_empty()) {
        if !wanted.contains(&h) {
            wanted.push(h);
        }
    }
    let have = cert_pem.as_deref().and_then(cert_sans).unwrap_or_default();
    if let (Some(c), Some(k)) = (&cert_pem, &key_pem)
        && wanted.iter().all(|w| have.contains(w))
    {
        return Ok((c.clone(), k.clone()));
    }
    let mut names = have.clone();
    for w in wanted {
        if !names.contains(&w) {
            names.push(w);
        }
    }
    if cert_pem.is_some() {
        let added: Vec<&String> = names.iter().filter(|n| !have.contains(n)).collect();
        tracing::info!(
            ?added,
            "the serving certificate lacks names or addresses: issuing it again"
        );
    }
    let (dns, ips): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| n.parse::<IpAddr>().is_err());
    let mut params = CertificateParams::new(dns.into_iter().cloned().collect::<Vec<_>>())
        .map_err(gen_err("the serving certificate"))?;
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress(ip.parse().expect("partitioned")));
    }
    params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    let key = match key_pem.as_deref().map(KeyPair::from_pem) {
        Some(Ok(k)) => k,
        _ => {
            let k = KeyPair::generate().map_err(gen_err("the serving key"))?;
            write_private(&dir.join("apiserver.key"), &k.serialize_pem())?;
            k
        }
    };
    let cert = params.signed_by(&key, issuer).map_err(gen_err("the serving certificate"))?;
    write(&dir.join("apiserver.crt"), &cert.pem())?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Accepts any serving certificate (signatures of the handshake are still checked).
#[derive(Debug)]
pub(crate) struct UnverifiedServer(pub(crate) Arc<rustls::crypto::CryptoProvider>);

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

/// A self-signed CA certificate and its key (PEM).
fn ca_cert(common_name: &str) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(gen_err("a CA key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(gen_err("a CA"))?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_after = rcgen::date_time_ymd(2036, 1, 1);
    let cert = params.self_signed(&key).map_err(gen_err("a CA"))?;
    Ok((cert.pem(), key.serialize_pem()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_certificate_gains_new_sans_and_keeps_its_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = Pki::load_or_create(dir.path(), &["10.1.2.3".into()]).expect("pki");
        let sans = cert_sans(&first.server_cert_pem).expect("sans");
        for want in ["127.0.0.1", "10.96.0.1", "kubernetes.default.svc", "10.1.2.3"] {
            assert!(sans.contains(&want.to_string()), "{want} in {sans:?}");
        }
        // The same hosts again: the certificate on disk is kept as it is.
        let again = Pki::load_or_create(dir.path(), &["10.1.2.3".into()]).expect("pki");
        assert_eq!(again.server_cert_pem, first.server_cert_pem);
        // A new --tls-san: issued again, with every old name, the new one and the same key.
        let hosts = ["skiff.example.test".to_string(), "192.0.2.7".to_string()];
        let grown = Pki::load_or_create(dir.path(), &hosts).expect("pki");
        assert_ne!(grown.server_cert_pem, first.server_cert_pem);
        assert_eq!(grown.server_key_pem, first.server_key_pem);
        let sans = cert_sans(&grown.server_cert_pem).expect("sans");
        for want in ["10.1.2.3", "skiff.example.test", "192.0.2.7", "localhost"] {
            assert!(sans.contains(&want.to_string()), "{want} in {sans:?}");
        }
        // The CA did not change: clients' kubeconfigs stay valid.
        assert_eq!(grown.ca_cert_pem, first.ca_cert_pem);
        // What was written is what a restart reads.
        let restarted = Pki::load_or_create(dir.path(), &[]).expect("pki");
        assert_eq!(restarted.server_cert_pem, grown.server_cert_pem);
        assert!(restarted.server_config().is_ok());
    }
}
