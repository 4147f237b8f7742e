//! TLS for the client: which server certificates to trust, and optionally the client's own
//! certificate for servers that ask for one (mutual TLS).

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::Error;

/// How the client checks the server over TLS (see [`ClientBuilder::tls`](crate::ClientBuilder::tls)).
#[derive(Clone)]
pub struct Tls {
    ca_pem: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client's private key stays out of logs.
        f.debug_struct("Tls")
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("domain", &self.domain)
            .finish()
    }
}

impl Tls {
    /// Trusts the operating system's root certificates: for a server certificate from a
    /// public or company CA.
    pub fn system_roots() -> Self {
        Tls {
            ca_pem: None,
            identity: None,
            domain: None,
        }
    }

    /// Trusts only the CA certificates in this PEM text: for a server certificate from a CA
    /// of your own (or a self-signed one).
    pub fn ca_pem(pem: impl Into<Vec<u8>>) -> Self {
        Tls {
            ca_pem: Some(pem.into()),
            ..Self::system_roots()
        }
    }

    /// [`Tls::ca_pem`] with the PEM read from a file.
    pub fn ca_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        Ok(Self::ca_pem(read(path.as_ref())?))
    }

    /// Presents this certificate chain and private key (PEM) to a server that requires client
    /// certificates (`mayfly --tls-client-ca`).
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// [`Tls::identity`] with the PEM read from files.
    pub fn identity_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, Error> {
        Ok(self.identity(read(cert.as_ref())?, read(key.as_ref())?))
    }

    /// Checks the server's certificate for this name rather than the host of the address
    /// (say, when connecting by IP address to a certificate issued for a DNS name).
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    pub(crate) fn config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_pem {
            Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path)
        .map_err(|e| Error::invalid(format!("cannot read {}: {e}", path.display()), None))
}
