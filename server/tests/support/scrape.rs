//! The metrics endpoint, read as a scraper does (the client tests use it too).

/// GET /metrics over plain HTTP/1.1.
pub(crate) async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics endpoint accepts");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: mayfly\r\nConnection: close\r\n\r\n")
        .await
        .expect("request sent");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}
