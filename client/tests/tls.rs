//! TLS end to end through the client: a server certificate from a CA of the test's own, mutual
//! TLS that refuses a client without a certificate, and addresses whose scheme contradicts
//! the TLS setting refused before anything is sent.

use mayfly_client::{Client, Error, Tls};
use mayfly_server::{Config, RunningServer, net::TlsFiles};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA, and a server and a client certificate it issued, as PEM files in a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "mayfly test CA");
        let ca =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().expect("key");
            let cert = CertificateParams::new(names)
                .expect("params")
                .signed_by(&key, &ca)
                .expect("signed");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
        let (client_cert, client_key) = leaf(vec!["a-client".into()]);
        std::fs::write(dir.path().join("server.pem"), server_cert).expect("write");
        std::fs::write(dir.path().join("server.key"), server_key).expect("write");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write");
        Pki {
            ca_pem: ca.pem(),
            dir,
            client_cert,
            client_key,
        }
    }

    fn files(&self, mutual: bool) -> TlsFiles {
        TlsFiles {
            cert: self.dir.path().join("server.pem"),
            key: self.dir.path().join("server.key"),
            client_ca: mutual.then(|| self.dir.path().join("ca.pem")),
        }
    }
}

async fn server(pki: &Pki, mutual: bool) -> RunningServer {
    RunningServer::start(Config {
        tls: Some(pki.files(mutual)),
        ..Config::default()
    })
    .await
    .expect("server starts")
}

#[tokio::test]
async fn the_client_talks_to_a_tls_server_it_trusts() {
    let pki = Pki::new();
    let server = server(&pki, false).await;
    let port = server.local_addr().port();
    for (i, address) in [
        format!("127.0.0.1:{port}"),
        format!("https://127.0.0.1:{port}"),
        format!("localhost:{port}"),
    ]
    .into_iter()
    .enumerate()
    {
        let client = Client::builder(&address)
            .tls(Tls::ca_pem(pki.ca_pem.clone()))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{address}: {e}"));
        let id = format!("db{i}");
        client.create_database(&id).await.expect("served over TLS");
    }
    let from_file = Client::builder(format!("127.0.0.1:{port}"))
        .tls(Tls::ca_file(pki.dir.path().join("ca.pem")).expect("reads"))
        .connect()
        .await
        .expect("connects");
    assert_eq!(from_file.list_databases().await.expect("lists").len(), 3);
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let (pki, stranger) = (Pki::new(), Pki::new());
    let server = server(&pki, false).await;
    let outcome = Client::builder(server.local_addr().to_string())
        .tls(Tls::ca_pem(stranger.ca_pem.clone()))
        .connect()
        .await;
    match outcome {
        Err(e @ Error::Connect { .. }) => {
            assert!(e.to_string().contains("certificate"), "says why: {e}")
        }
        Err(e) => panic!("not Connect: {e:?}"),
        Ok(client) => {
            // tonic may connect lazily on some paths: the first call must fail then.
            let e = client.list_databases().await.expect_err("untrusted");
            assert!(matches!(e, Error::Connect { .. }), "{e:?}");
        }
    }
}

#[tokio::test]
async fn plaintext_clients_get_nothing_from_a_tls_server() {
    let pki = Pki::new();
    let server = server(&pki, false).await;
    let outcome = async {
        Client::connect(server.local_addr().to_string())
            .await?
            .list_databases()
            .await
    };
    let e = tokio::time::timeout(std::time::Duration::from_secs(20), outcome)
        .await
        .expect("fails promptly")
        .expect_err("plaintext refused");
    assert!(
        matches!(e, Error::Unavailable(_) | Error::Other { .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn mutual_tls_serves_a_client_with_a_certificate_and_refuses_one_without() {
    let pki = Pki::new();
    let server = server(&pki, true).await;
    let address = server.local_addr().to_string();
    let with_certificate = Client::builder(&address)
        .tls(
            Tls::ca_pem(pki.ca_pem.clone())
                .identity(pki.client_cert.clone(), pki.client_key.clone()),
        )
        .connect()
        .await
        .expect("connects");
    with_certificate
        .create_database("mtls")
        .await
        .expect("served");

    let without = async {
        Client::builder(&address)
            .tls(Tls::ca_pem(pki.ca_pem.clone()))
            .connect()
            .await?
            .list_databases()
            .await
    };
    let e = tokio::time::timeout(std::time::Duration::from_secs(20), without)
        .await
        .expect("fails promptly")
        .expect_err("a client without a certificate is refused");
    assert!(
        matches!(&e, Error::Unavailable(_) | Error::Connect { .. } if e.to_string().to_lowercase().contains("certificate")),
        "says why: {e:?}"
    );

    // A certificate from another CA is no better than none.
    let stranger = Pki::new();
    let foreign = async {
        Client::builder(&address)
            .tls(
                Tls::ca_pem(pki.ca_pem.clone())
                    .identity(stranger.client_cert.clone(), stranger.client_key.clone()),
            )
            .connect()
            .await?
            .list_databases()
            .await
    };
    let e = tokio::time::timeout(std::time::Duration::from_secs(20), foreign)
        .await
        .expect("fails promptly")
        .expect_err("a foreign client certificate is refused");
    assert!(
        matches!(e, Error::Unavailable(_) | Error::Connect { .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_scheme_that_contradicts_the_tls_setting_is_refused_before_connecting() {
    let https = Client::connect("https://127.0.0.1:1")
        .await
        .expect_err("no TLS set");
    assert!(
        matches!(&https, Error::InvalidArgument(m) if m.message().contains(".tls(")),
        "{https:?}"
    );
    let http = Client::builder("http://127.0.0.1:1")
        .tls(Tls::system_roots())
        .connect()
        .await
        .expect_err("TLS set");
    assert!(
        matches!(&http, Error::InvalidArgument(m) if m.message().contains("plaintext")),
        "{http:?}"
    );
}
