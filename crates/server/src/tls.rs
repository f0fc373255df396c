//! TLS for client connections (rustls), shaped for replication links too
//! ====================================================================
//! [`server_config`] builds what a listener needs from PEM files: the server's certificate
//! chain and private key, and, for mutual TLS, the CA whose certificates clients must
//! present. [`client_config`] builds the other side (trusted CA, optional client identity);
//! the server itself does not dial out, but a backup's replication link will, with the
//! same files. Both use rustls's ring provider and its safe default protocol versions
//! (TLS 1.2 and 1.3).
//!
//! Every error names the file it came from, so a wrong path or a key that does not match
//! its certificate stops the server at start-up with a message an operator can act on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS: reading {what} from {path}: {detail}")]
    File { what: &'static str, path: PathBuf, detail: String },
    #[error("TLS: {path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("TLS: {0}")]
    Setup(String),
}

/// Where a node's TLS material lives (the `tls_*` keys of the config file).
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// PEM certificate chain presented to peers, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM CA certificates that peer certificates must chain to.
    pub ca_cert_file: Option<PathBuf>,
    /// Require clients to present a certificate signed by `ca_cert_file` (mutual TLS).
    pub auth_clients: bool,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_err = |detail: String| TlsError::File { what: "certificates", path: path.into(), detail };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what: "PEM certificate", path: path.into() });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty { what: "PEM private key", path: path.into() },
        e => TlsError::File { what: "the private key", path: path.into(), detail: e.to_string() },
    })
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots.add(c).map_err(|e| TlsError::File {
            what: "CA certificates",
            path: path.into(),
            detail: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

/// The listener side: our certificate and key, and the client CA when clients must
/// authenticate.
pub fn server_config(f: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let builder = match (&f.ca_cert_file, f.auth_clients) {
        (Some(ca), true) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                .build()
                .map_err(|e| TlsError::Setup(format!("client verifier from {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        (None, true) => return Err(TlsError::Setup("tls_auth_clients needs tls_ca_cert_file".into())),
        (_, false) => builder.with_no_client_auth(),
    };
    let chain = certs(&f.cert_file)?;
    let key = key(&f.key_file)?;
    let cfg = builder.with_single_cert(chain, key).map_err(|e| {
        TlsError::Setup(format!("certificate {} with key {}: {e}", f.cert_file.display(), f.key_file.display()))
    })?;
    Ok(Arc::new(cfg))
}

/// The dialing side (a replication link, a test client): trusts `ca_cert_file` and, when
/// `cert_file`/`key_file` are set, presents them.
pub fn client_config(ca_cert_file: &Path, identity: Option<(&Path, &Path)>) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_root_certificates(roots(ca_cert_file)?);
    let cfg = match identity {
        Some((cert, k)) => builder
            .with_client_auth_cert(certs(cert)?, key(k)?)
            .map_err(|e| TlsError::Setup(format!("client certificate {}: {e}", cert.display())))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// The name a client checks the server's certificate against.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_string()).map_err(|e| TlsError::Setup(format!("server name {host:?}: {e}")))
}

#[cfg(any(test, feature = "test-pki"))]
pub mod testing {
    //! Certificates made at test time: a CA, a server certificate for 127.0.0.1 and
    //! localhost, and a client certificate, all signed by the CA.
    use std::path::{Path, PathBuf};

    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

    pub struct Pki {
        pub ca: PathBuf,
        pub server_cert: PathBuf,
        pub server_key: PathBuf,
        pub client_cert: PathBuf,
        pub client_key: PathBuf,
    }

    pub fn make(dir: &Path) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // Distinct subjects: OpenSSL (redis-cli) takes a leaf whose subject equals its
        // issuer's for self-signed.
        ca_params.distinguished_name.push(DnType::CommonName, "ditto test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf = |names: Vec<String>, stem: &str| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, format!("ditto test {stem}"));
            let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
            let (c, k) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            (c, k)
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()], "server");
        let (client_cert, client_key) = leaf(vec!["client".into()], "client");
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca.pem()).unwrap();
        Pki { ca: ca_path, server_cert, server_key, client_cert, client_key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let pki = testing::make(dir.path());
        let ok = TlsFiles {
            cert_file: pki.server_cert.clone(),
            key_file: pki.server_key.clone(),
            ca_cert_file: Some(pki.ca.clone()),
            auth_clients: true,
        };
        server_config(&ok).unwrap();
        client_config(&pki.ca, Some((&pki.client_cert, &pki.client_key))).unwrap();

        let missing = TlsFiles { cert_file: dir.path().join("nope.crt"), ..ok.clone() };
        let e = server_config(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.crt"), "{e}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let e = server_config(&TlsFiles { cert_file: garbage.clone(), ..ok.clone() }).unwrap_err().to_string();
        assert!(e.contains("garbage.pem") && e.contains("no PEM certificate"), "{e}");
        let e = server_config(&TlsFiles { key_file: garbage.clone(), ..ok.clone() }).unwrap_err().to_string();
        assert!(e.contains("garbage.pem") && e.contains("private key"), "{e}");

        // A key that is not the certificate's.
        let e = server_config(&TlsFiles { key_file: pki.client_key.clone(), ..ok.clone() }).unwrap_err().to_string();
        assert!(e.contains("server.crt") && e.contains("client.key"), "{e}");

        let e = server_config(&TlsFiles { ca_cert_file: None, ..ok }).unwrap_err().to_string();
        assert!(e.contains("tls_ca_cert_file"), "{e}");
    }
}
