//! What every example does first: connect to the server at the address given, or, with none,
//! start one in this process so that the example runs on its own.

use mayfly_client::Client;
use mayfly_server::RunningServer;

/// A client of the server at `address`, with the key in `MAYFLY_KEY` if set (a server keeping
/// its data on disk needs it: `MAYFLY_KEY=$(cat mayfly-data/keys/primary)`); without an address,
/// of a server started here, returned beside it: keep it for as long as the client is used.
pub(crate) async fn connect(
    address: Option<String>,
) -> Result<(Client, Option<RunningServer>), Box<dyn std::error::Error>> {
    let embedded = match &address {
        Some(_) => None,
        None => Some(RunningServer::start(Default::default()).await?),
    };
    let address = match (address, &embedded) {
        (Some(address), _) => address,
        (None, server) => server
            .as_ref()
            .map(|s| s.local_addr().to_string())
            .unwrap_or_default(),
    };
    let client = Client::builder(&address)
        .key_from_env_if_set()?
        .connect()
        .await?;
    Ok((client, embedded))
}
