//! Mayfly clusters for tests: `mayfly` processes joined on a [`super::nats::NatsCluster`], and
//! waiting until their partitions' ownership has settled.

use std::time::{Duration, Instant};

use super::nats::NatsCluster;

/// `mayfly` processes of a cluster on `nats`, with 4 partitions, keeping partitions in memory.
pub(crate) fn cluster_node(nats: &NatsCluster, dir: &std::path::Path, node: &str) -> super::Mayfly {
    let args = cluster_args(nats, node);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    super::Mayfly::start(&dir.join(node), &args)
}

/// [`cluster_node`], requiring the cluster's keys (a copy in `dir/<node>/keys/`).
pub(crate) fn keyed_cluster_node(
    nats: &NatsCluster,
    dir: &std::path::Path,
    node: &str,
) -> super::Mayfly {
    let args = cluster_args(nats, node);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    super::Mayfly::start_with_keys(&dir.join(node), &args)
}

pub(crate) fn cluster_args(nats: &NatsCluster, node: &str) -> Vec<String> {
    let urls = nats.urls().join(",");
    let monitors = nats.monitors().join(",");
    [
        "--storage",
        "memory",
        "--cluster",
        &urls,
        "--cluster-nats-monitor",
        &monitors,
        "--node-id",
        node,
        "--partitions",
        "4",
        "--shards",
        "4",
    ]
    .map(String::from)
    .to_vec()
}

/// The partition map as `admin`'s node has it once ownership has settled over `nodes`: every
/// partition owned by one of them, evenly (within one), unchanged over 1.5 s (nodes hand
/// partitions over to even out). Bounded by 45 s.
pub(crate) async fn settled_map(
    admin: &mayfly_proto::v1::client::AdminClient<tonic::transport::Channel>,
    nodes: &[&str],
) -> mayfly_proto::v1::PartitionMap {
    settled_map_with(admin, nodes, None).await
}

/// [`settled_map`], asking with `key` (a cluster with keys).
pub(crate) async fn settled_map_with(
    admin: &mayfly_proto::v1::client::AdminClient<tonic::transport::Channel>,
    nodes: &[&str],
    key: Option<&str>,
) -> mayfly_proto::v1::PartitionMap {
    let deadline = Instant::now() + Duration::from_secs(45);
    let read = || {
        let mut admin = admin.clone();
        async move {
            let request = super::clients::with(key, mayfly_proto::v1::GetPartitionMapRequest {});
            admin
                .get_partition_map(request)
                .await
                .expect("partition map")
                .into_inner()
        }
    };
    let owners = |m: &mayfly_proto::v1::PartitionMap| -> Vec<(String, u64)> {
        m.owners
            .iter()
            .map(|o| (o.owner.clone(), o.epoch))
            .collect()
    };
    let balanced = |m: &mayfly_proto::v1::PartitionMap| {
        let counts: Vec<usize> = nodes
            .iter()
            .map(|n| m.owners.iter().filter(|o| o.owner == *n).count())
            .collect();
        let owned: usize = counts.iter().sum();
        owned == m.owners.len()
            && counts.iter().max().unwrap_or(&0) - counts.iter().min().unwrap_or(&0) <= 1
    };
    loop {
        let first = read().await;
        if balanced(&first) {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            let second = read().await;
            if owners(&first) == owners(&second) {
                return second;
            }
        }
        assert!(
            Instant::now() < deadline,
            "ownership did not settle over {nodes:?} in 45 s: {:?}",
            first.owners
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
