//! TLS for the gRPC listener: a certificate and key read from PEM files, optionally a CA that
//! client certificates must chain to (mutual TLS). Reloading swaps the configuration used by
//! new handshakes; connections already up keep theirs.

use std::{fmt, fs, io, path::PathBuf, sync::Arc};

use parking_lot::RwLock;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{self, RootCertStore, ServerConfig, server::WebPkiClientVerifier},
};

/// Where the server's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When given, clients must present a certificate issued by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
}

/// Why TLS material could not be loaded.
#[derive(Debug)]
pub struct TlsError {
    file: PathBuf,
    reason: String,
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS: {}: {}", self.file.display(), self.reason)
    }
}

impl std::error::Error for TlsError {}

/// The TLS configuration new connections are accepted with.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl ServerTls {
    /// Loads `files`; fails with the file and reason if any is missing or unusable.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let config = server_config(&files)?;
        Ok(ServerTls {
            files,
            current: RwLock::new(Arc::new(config)),
        })
    }

    /// Reads the files again and uses them for new connections. On failure the certificate in
    /// use stays in use: a bad file never takes a serving server off the air.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = server_config(&self.files)?;
        *self.current.write() = Arc::new(config);
        Ok(())
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// An acceptor with the configuration in force now.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().clone())
    }
}

fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(&files.cert)?;
    let key = read(&files.key).and_then(|pem| {
        PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError {
            file: files.key.clone(),
            reason: format!("no private key in it ({e})"),
        })
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            file: files.cert.clone(),
            reason: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert).map_err(|e| TlsError {
                    file: ca.clone(),
                    reason: format!("not a usable CA certificate ({e})"),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError {
                    file: ca.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| TlsError {
        file: files.key.clone(),
        reason: format!("does not go with {} ({e})", files.cert.display()),
    })?;
    // gRPC is HTTP/2 only; clients (grpcurl, grpc-go) insist on negotiating it.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

fn read(file: &PathBuf) -> Result<Vec<u8>, TlsError> {
    fs::read(file).map_err(|e: io::Error| TlsError {
        file: file.clone(),
        reason: e.to_string(),
    })
}

fn certificates(file: &PathBuf) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(file)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError {
            file: file.clone(),
            reason: format!("unreadable PEM ({e})"),
        })?;
    if certs.is_empty() {
        return Err(TlsError {
            file: file.clone(),
            reason: "no certificate in it (expected PEM \"BEGIN CERTIFICATE\" blocks)".into(),
        });
    }
    Ok(certs)
}

/// How a node serving TLS with `files` checks the other nodes when it forwards to them: by
/// `peer_ca` (else its `--tls-client-ca`), presenting its own certificate where the nodes ask
/// clients for one.
pub(crate) fn peer_tls(
    files: &TlsFiles,
    peer_ca: Option<&std::path::Path>,
) -> Result<tonic::transport::ClientTlsConfig, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let ca = peer_ca.or(files.client_ca.as_deref()).ok_or(
        "a cluster node serving TLS forwards to the other nodes over TLS: give --cluster-peer-ca, the CA (PEM) that issued their certificates",
    )?;
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
    if files.client_ca.is_some() {
        // The other nodes ask clients for a certificate: this node shows its own.
        config = config.identity(Identity::from_pem(read(&files.cert)?, read(&files.key)?));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &std::path::Path, name: &str) -> TlsFiles {
        let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}.key"));
        fs::write(&cert, pair.cert.pem()).expect("write");
        fs::write(&key, pair.signing_key.serialize_pem()).expect("write");
        TlsFiles {
            cert,
            key,
            client_ca: None,
        }
    }

    #[test]
    fn a_failed_reload_keeps_the_certificate_in_use() {
        let dir = tempfile::tempdir().expect("dir");
        let files = write_pair(dir.path(), "server");
        let tls = ServerTls::load(files.clone()).expect("loads");
        let before = tls.current.read().clone();
        fs::write(&files.cert, "not a certificate").expect("write");
        let err = tls.reload().expect_err("refused");
        assert!(err.to_string().contains("no certificate"), "{err}");
        assert!(
            Arc::ptr_eq(&before, &tls.current.read()),
            "still the old one"
        );
        write_pair(dir.path(), "server");
        tls.reload().expect("a good pair loads");
        assert!(!Arc::ptr_eq(&before, &tls.current.read()), "swapped");
    }

    #[test]
    fn errors_name_the_file_and_what_is_wrong() {
        let dir = tempfile::tempdir().expect("dir");
        let mut files = write_pair(dir.path(), "a");
        let other = write_pair(dir.path(), "b");
        files.key = other.key.clone();
        let err = ServerTls::load(files.clone()).expect_err("mismatched");
        assert!(err.to_string().contains("does not go with"), "{err}");
        files.key = dir.path().join("missing.key");
        let err = ServerTls::load(files).expect_err("missing");
        assert!(err.to_string().contains("missing.key"), "{err}");
    }
}
