//! certificates.k8s.io, shared by the apiserver (validation, the join path), the controllers
//! (approving and signing) and the agent (rotation): the well-known signers, what a PEM
//! certificate request asks for, upstream's rules for node client and kubelet serving
//! requests, and signing a request with the cluster CA.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use x509_parser::prelude::FromDer;

/// Client certificates for the apiserver, any subject (upstream's signer).
pub const KUBE_APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// Node client certificates: `CN=system:node:<name>`, `O=system:nodes`.
pub const KUBE_APISERVER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Kubelet serving certificates: `CN=system:node:<name>`, `O=system:nodes`, DNS/IP names.
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// Upstream's signer of requests that name none; never signed by skiff (nor by upstream's
/// built-in signers).
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

pub const NODE_PREFIX: &str = "system:node:";
pub const NODES_GROUP: &str = "system:nodes";

/// What a certificate request asks for: its subject and subject alternative names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
}

/// Parses a PEM `CERTIFICATE REQUEST` (upstream's `ParseCSR`): exactly one block of that
/// type, well-formed, with a signature made by its own key.
pub fn parse_request(pem: &[u8]) -> Result<Request, String> {
    let text =
        std::str::from_utf8(pem).map_err(|_| "PEM block type must be CERTIFICATE REQUEST")?;
    let (label, der) = pem_block(text).ok_or("PEM block type must be CERTIFICATE REQUEST")?;
    if label != "CERTIFICATE REQUEST" && label != "NEW CERTIFICATE REQUEST" {
        return Err("PEM block type must be CERTIFICATE REQUEST".into());
    }
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
        .map_err(|e| format!("parsing the certificate request: {e}"))?;
    // The signature: rcgen checks it while it reads the request.
    rcgen::CertificateSigningRequestParams::from_pem(text)
        .map_err(|e| format!("the certificate request's signature does not verify: {e}"))?;
    let info = &csr.certification_request_info;
    let text_of = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        a.as_str().map(str::to_string).map_err(|e| format!("a subject attribute: {e}"))
    };
    let mut out = Request {
        common_name: match info.subject.iter_common_name().next() {
            Some(cn) => text_of(cn)?,
            None => String::new(),
        },
        organizations: info.subject.iter_organization().map(text_of).collect::<Result<_, _>>()?,
        ..Request::default()
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
            use x509_parser::extensions::GeneralName;
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => out.dns_names.push(d.to_string()),
                    GeneralName::RFC822Name(e) => out.emails.push(e.to_string()),
                    GeneralName::URI(u) => out.uris.push(u.to_string()),
                    GeneralName::IPAddress(b) => match b.len() {
                        4 => out
                            .ip_addresses
                            .push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                        16 => out
                            .ip_addresses
                            .push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                        _ => return Err("an IP address SAN of a bad length".into()),
                    },
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

/// The first PEM block of `text`: its label and decoded bytes.
fn pem_block(text: &str) -> Option<(String, Vec<u8>)> {
    use base64::Engine;
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + 11..];
    let label_end = rest.find("-----")?;
    let label = rest[..label_end].to_string();
    let body = &rest[label_end + 5..];
    let end = body.find(&format!("-----END {label}-----"))?;
    let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some((label, der))
}

/// The usages upstream accepts in `spec.usages` (`certificates.KeyUsage`).
pub const KNOWN_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// Upstream's `IsKubeletClientCSR` shape (`ValidateKubeletClientCSR`): `O=[system:nodes]`,
/// `CN=system:node:<name>`, no SANs, and usages "client auth" with "digital signature"
/// (and optionally "key encipherment"). `Err` says what does not fit.
pub fn check_node_client(req: &Request, usages: &[String]) -> Result<String, String> {
    if req.organizations != [NODES_GROUP] {
        return Err(format!("subject organization is not {NODES_GROUP}"));
    }
    let node = node_of(req)?;
    if !req.dns_names.is_empty() || !req.ip_addresses.is_empty() {
        return Err("DNS or IP subjectAltNames are not allowed".into());
    }
    if !req.emails.is_empty() || !req.uris.is_empty() {
        return Err("Email or URI subjectAltNames are not allowed".into());
    }
    check_usages(usages, &["client auth"])?;
    Ok(node)
}

/// Upstream's `ValidateKubeletServingCSR`: `O=[system:nodes]`, `CN=system:node:<name>`, at
/// least one DNS or IP name, no email or URI names, "server auth" usage.
pub fn check_kubelet_serving(req: &Request, usages: &[String]) -> Result<String, String> {
    if req.organizations != [NODES_GROUP] {
        return Err(format!("subject organization is not {NODES_GROUP}"));
    }
    let node = node_of(req)?;
    if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
        return Err("DNS or IP subjectAltName is required".into());
    }
    if !req.emails.is_empty() || !req.uris.is_empty() {
        return Err("Email or URI subjectAltNames are not allowed".into());
    }
    check_usages(usages, &["server auth"])?;
    Ok(node)
}

fn node_of(req: &Request) -> Result<String, String> {
    req.common_name
        .strip_prefix(NODE_PREFIX)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("subject common name does not begin with {NODE_PREFIX}"))
}

/// `usages` holds `required` and "digital signature"; besides those only "key
/// encipherment" is allowed (upstream's lists for both node signers).
fn check_usages(usages: &[String], required: &[&str]) -> Result<(), String> {
    let allowed =
        |u: &str| required.contains(&u) || matches!(u, "digital signature" | "key encipherment");
    if let Some(u) = usages.iter().find(|u| !allowed(u)) {
        return Err(format!("usage {u:?} is not allowed"));
    }
    for want in required.iter().copied().chain(["digital signature"]) {
        if !usages.iter().any(|u| u == want) {
            return Err(format!("missing required usage {want:?}"));
        }
    }
    Ok(())
}

/// What the signer puts in a certificate besides the request's key and subject.
#[derive(Debug, Clone)]
pub struct Profile<'a> {
    pub usages: &'a [String],
    /// The certificate's lifetime (the signer's maximum, or the request's
    /// `expirationSeconds` when shorter).
    pub duration: Duration,
}

/// Signs `csr_pem` with the CA: the request's subject (CN and at most one O: the encoder
/// writes one value per attribute type) and DNS/IP names, the profile's usages and
/// lifetime (backdated for clock skew, as upstream's signer: five minutes, or a tenth of a
/// shorter lifetime). A PEM certificate.
pub fn sign(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    csr_pem: &str,
    profile: &Profile<'_>,
) -> Result<String, String> {
    let req = parse_request(csr_pem.as_bytes())?;
    if req.organizations.len() > 1 {
        return Err("skiff's signers sign subjects with at most one organization".into());
    }
    let ca_key = rcgen::KeyPair::from_pem(ca_key_pem).map_err(|e| format!("the CA key: {e}"))?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)
        .map_err(|e| format!("the CA certificate: {e}"))?;
    let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| format!("the certificate request: {e}"))?;
    let mut params = rcgen::CertificateParams::new(req.dns_names.clone())
        .map_err(|e| format!("a DNS name: {e}"))?;
    params
        .subject_alt_names
        .extend(req.ip_addresses.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
    if !req.common_name.is_empty() {
        params.distinguished_name.push(rcgen::DnType::CommonName, req.common_name.as_str());
    }
    if let Some(o) = req.organizations.first() {
        params.distinguished_name.push(rcgen::DnType::OrganizationName, o.as_str());
    }
    use rcgen::{ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
    for u in profile.usages {
        match u.as_str() {
            "digital signature" | "signing" => params.key_usages.push(Ku::DigitalSignature),
            "key encipherment" => params.key_usages.push(Ku::KeyEncipherment),
            "content commitment" => params.key_usages.push(Ku::ContentCommitment),
            "key agreement" => params.key_usages.push(Ku::KeyAgreement),
            "data encipherment" => params.key_usages.push(Ku::DataEncipherment),
            "client auth" => params.extended_key_usages.push(Eku::ClientAuth),
            "server auth" => params.extended_key_usages.push(Eku::ServerAuth),
            "code signing" => params.extended_key_usages.push(Eku::CodeSigning),
            "email protection" => params.extended_key_usages.push(Eku::EmailProtection),
            "timestamping" => params.extended_key_usages.push(Eku::TimeStamping),
            "ocsp signing" => params.extended_key_usages.push(Eku::OcspSigning),
            // A CA's usages are never granted through a request.
            "cert sign" | "crl sign" => return Err(format!("usage {u:?} is not signed")),
            _ => {}
        }
    }
    let now = SystemTime::now();
    params.not_before = (now - (profile.duration / 10).min(Duration::from_secs(300))).into();
    params.not_after = (now + profile.duration).into();
    params.use_authority_key_identifier_extension = true;
    csr.params = params;
    let cert = csr.signed_by(&issuer).map_err(|e| format!("signing: {e}"))?;
    Ok(cert.pem())
}

/// What `read` takes from the first certificate of a PEM bundle.
fn with_certificate<T>(
    cert_pem: &str,
    read: impl FnOnce(&x509_parser::certificate::X509Certificate<'_>) -> Option<T>,
) -> Option<T> {
    let (label, der) = pem_block(cert_pem)?;
    if label != "CERTIFICATE" {
        return None;
    }
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).ok()?;
    read(&cert)
}

/// The validity window of the first certificate of a PEM bundle.
pub fn validity(cert_pem: &str) -> Option<(SystemTime, SystemTime)> {
    with_certificate(cert_pem, |cert| {
        let at = |t: x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            (secs >= 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64))
        };
        Some((at(cert.validity().not_before)?, at(cert.validity().not_after)?))
    })
}

/// The subject common name of the first certificate of a PEM bundle.
pub fn common_name(cert_pem: &str) -> Option<String> {
    with_certificate(cert_pem, |cert| {
        cert.subject().iter_common_name().next()?.as_str().ok().map(str::to_string)
    })
}

/// Whether `pem` is one or more PEM `CERTIFICATE` blocks, each a parseable certificate (what
/// `status.certificate` must hold).
pub fn valid_certificates(pem: &[u8]) -> bool {
    let Ok(mut text) = std::str::from_utf8(pem) else { return false };
    let mut n = 0;
    while let Some(start) = text.find("-----BEGIN ") {
        let Some((label, der)) = pem_block(&text[start..]) else { return false };
        if label != "CERTIFICATE"
            || x509_parser::certificate::X509Certificate::from_der(&der).is_err()
        {
            return false;
        }
        n += 1;
        let end_marker = "-----END CERTIFICATE-----";
        match text[start..].find(end_marker) {
            Some(e) => text = &text[start + e + end_marker.len()..],
            None => return false,
        }
    }
    n > 0 && text.trim().is_empty()
}

/// A new key and a PEM request for `common_name` in `organization` with the given names.
pub fn new_request(
    common_name: &str,
    organization: &str,
    dns_names: &[String],
    ips: &[IpAddr],
) -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(dns_names.to_vec())?;
    params.subject_alt_names.extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
    params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
    params.distinguished_name.push(rcgen::DnType::OrganizationName, organization);
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((csr, key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "test-ca");
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn requests_parse_and_node_shapes_follow_upstream() {
        let (csr, _) = new_request("system:node:n1", NODES_GROUP, &[], &[]).unwrap();
        let req = parse_request(csr.as_bytes()).unwrap();
        assert_eq!(req.common_name, "system:node:n1");
        assert_eq!(req.organizations, [NODES_GROUP]);
        let usages = |u: &[&str]| u.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            check_node_client(&req, &usages(&["digital signature", "client auth"])).unwrap(),
            "n1"
        );
        assert!(check_node_client(&req, &usages(&["client auth"])).is_err());
        assert!(check_node_client(&req, &usages(&["digital signature", "server auth"])).is_err());
        let (other, _) = new_request("alice", NODES_GROUP, &[], &[]).unwrap();
        let other = parse_request(other.as_bytes()).unwrap();
        assert!(check_node_client(&other, &usages(&["digital signature", "client auth"])).is_err());
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let (serving, _) =
            new_request("system:node:n1", NODES_GROUP, &["n1".into()], &[ip]).unwrap();
        let serving = parse_request(serving.as_bytes()).unwrap();
        assert_eq!(serving.dns_names, ["n1"]);
        assert_eq!(serving.ip_addresses, [ip]);
        assert!(
            check_node_client(&serving, &usages(&["digital signature", "client auth"])).is_err()
        );
        assert_eq!(
            check_kubelet_serving(&serving, &usages(&["digital signature", "server auth"]))
                .unwrap(),
            "n1"
        );
        // Not a request, a damaged one, another block type.
        assert!(parse_request(b"hello").is_err());
        // A flipped bit in the signature: the request no longer verifies.
        use base64::Engine;
        let (_, mut der) = pem_block(&csr).unwrap();
        *der.last_mut().unwrap() ^= 1;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
        let damaged = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n"
        );
        assert!(parse_request(damaged.as_bytes()).unwrap_err().contains("signature"));
        let (ca_pem, _) = ca();
        assert!(parse_request(ca_pem.as_bytes()).unwrap_err().contains("CERTIFICATE REQUEST"));
    }

    #[test]
    fn signed_certificates_carry_the_subject_usages_and_lifetime() {
        let (ca_pem, ca_key) = ca();
        let (csr, _) = new_request("system:node:n1", NODES_GROUP, &[], &[]).unwrap();
        let usages = vec!["digital signature".to_string(), "client auth".to_string()];
        let profile = Profile { usages: &usages, duration: Duration::from_secs(3600) };
        let cert = sign(&ca_pem, &ca_key, &csr, &profile).unwrap();
        assert!(valid_certificates(cert.as_bytes()));
        assert!(valid_certificates(format!("{cert}{cert}").as_bytes()));
        assert!(!valid_certificates(b"not a certificate"));
        assert!(!valid_certificates(csr.as_bytes()));
        let (not_before, not_after) = validity(&cert).unwrap();
        let lifetime = not_after.duration_since(not_before).unwrap();
        assert_eq!(lifetime, Duration::from_secs(3600 + 300));
        let short = Profile { usages: &usages, duration: Duration::from_secs(90) };
        let cert = sign(&ca_pem, &ca_key, &csr, &short).unwrap();
        let (not_before, not_after) = validity(&cert).unwrap();
        assert_eq!(not_after.duration_since(not_before).unwrap(), Duration::from_secs(99));
        assert_eq!(common_name(&cert).as_deref(), Some("system:node:n1"));
        let (_, der) = pem_block(&cert).unwrap();
        let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(&der).unwrap();
        let eku = parsed.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        // The CA verifies it.
        let (_, ca_der) = pem_block(&ca_pem).unwrap();
        let (_, ca_cert) = x509_parser::certificate::X509Certificate::from_der(&ca_der).unwrap();
        assert!(parsed.verify_signature(Some(ca_cert.public_key())).is_ok());
    }
}
