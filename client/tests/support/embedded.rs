//! A server in the test's process on 127.0.0.1:0 (memory storage, no keys) and a client of it.

use mayfly_client::Client;
use mayfly_server::RunningServer;

/// The server (keep it: dropping it stops it) and a client connected to it.
pub(crate) async fn start() -> (RunningServer, Client) {
    let server = RunningServer::start(Default::default())
        .await
        .expect("server starts");
    let client = Client::connect(server.local_addr().to_string())
        .await
        .expect("client connects");
    (server, client)
}
