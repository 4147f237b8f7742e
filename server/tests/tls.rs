//! The binary's TLS as operators use it: SIGHUP swaps the certificate without dropping open
//! connections, and plaintext is refused beyond loopback unless asked for.

use std::{path::Path, process::Command, time::Duration};

use mayfly_proto::v1::{ListDatabasesRequest, client::DatabasesClient};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tonic::{
    Request,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

mod support;
use support::Mayfly;

/// A new CA's certificate (PEM), after writing a server certificate it issued for
/// 127.0.0.1 to `dir/server.pem` and `dir/server.key`.
fn issue_server_certificate(dir: &Path) -> String {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "test CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("signed");
    // Written whole and renamed into place, as an operator's tooling would.
    for (name, text) in [
        ("server.pem", cert.pem()),
        ("server.key", key.serialize_pem()),
    ] {
        let tmp = dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, dir.join(name)).expect("rename");
    }
    ca.pem()
}

async fn channel(addr: &str, ca_pem: &str) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)))?
        .connect()
        .await
}

async fn list(channel: &Channel) -> Result<(), tonic::Status> {
    DatabasesClient::new(channel.clone())
        .list_databases(Request::new(ListDatabasesRequest {}))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn sighup_reloads_the_certificate_and_open_connections_carry_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first_ca = issue_server_certificate(dir.path());
    let cert = dir.path().join("server.pem");
    let key = dir.path().join("server.key");
    let server = Mayfly::start(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            cert.to_str().expect("utf-8"),
            "--tls-key",
            key.to_str().expect("utf-8"),
        ],
    );
    let open = channel(&server.addr, &first_ca).await.expect("connects");
    list(&open).await.expect("served over TLS");

    let second_ca = issue_server_certificate(dir.path());
    let hup = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(hup.success());
    // New connections get the new certificate once the signal is handled.
    let mut reloaded = false;
    for _ in 0..100 {
        if let Ok(new) = channel(&server.addr, &second_ca).await
            && list(&new).await.is_ok()
        {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reloaded,
        "a client trusting the new CA is served within 5 s"
    );
    let old_trust = async {
        list(&channel(&server.addr, &first_ca).await.ok()?)
            .await
            .ok()
    };
    assert!(
        old_trust.await.is_none(),
        "new connections no longer show the old certificate"
    );
    // Had the open connection been dropped, the channel would reconnect, see the new
    // certificate and fail: it is still the same connection.
    for _ in 0..3 {
        list(&open)
            .await
            .expect("the connection opened before the reload goes on");
    }

    // A broken file on the next SIGHUP leaves the certificate in use in use.
    std::fs::write(&cert, "not a certificate").expect("write");
    let hup = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(hup.success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = channel(&server.addr, &second_ca).await.expect("connects");
    list(&new)
        .await
        .expect("still served with the second certificate");
}

#[test]
fn plaintext_beyond_loopback_needs_to_be_asked_for() {
    let dir = tempfile::tempdir().expect("temp dir");
    let refused = Mayfly::try_start(&dir.path().join("data"), &["--listen", "0.0.0.0:0"])
        .err()
        .expect("refused");
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("--insecure-plaintext") && refused.stderr.contains("--tls-cert"),
        "says what to do: {}",
        refused.stderr
    );
    let served = Mayfly::try_start(
        &dir.path().join("data"),
        &["--listen", "0.0.0.0:0", "--insecure-plaintext"],
    );
    assert!(served.is_ok(), "starts when asked");
}
