//! TLS for client connections: the builders live in `ditto_replication::tls`, shared with
//! the links between nodes; here, certificates made at test time.

pub use ditto_replication::tls::{client_config, server_config, server_name, TlsError, TlsFiles};

#[cfg(any(test, feature = "pki"))]
pub use ditto_replication::tls::pki;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::make(dir.path());
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
