//! Where a cluster's partitions are served, as a node knows it: each partition's lease (its
//! owner) and each node's address. Forwarding and the rebalancing read them for every request
//! and every few seconds, so they come from a cache that watches the two buckets; a
//! partition the cache does not know yet is read from its key. A watch can lag: a request
//! forwarded on a stale owner is refused there (`NOT_OWNER`, never forwarded again), the
//! entry is forgotten, and the client's retry finds the owner. `Admin/GetPartitionMap` reads
//! the keys themselves.

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_nats::jetstream::kv;
use futures_util::StreamExt;
use mayfly_cluster::{LeaseError, LeaseRecord, Leases};
use parking_lot::RwLock;
use tokio::task::JoinHandle;
use tonic::Status;

use crate::{
    cluster_report::{self, PartitionCopy},
    grpc::forward::Owners,
};

/// What the watches have seen.
#[derive(Debug, Default)]
struct Seen {
    /// By partition: its lease's owner; absent while unknown (not seen yet, or forgotten).
    owners: HashMap<u32, String>,
    /// By node id: its gRPC address.
    addresses: HashMap<String, String>,
}

/// A node's view of the cluster's partition map.
pub(crate) struct Directory {
    node: String,
    leases: Arc<Leases>,
    nodes: kv::Store,
    /// The member list: each live node's heartbeat, with its report of its copies.
    members: kv::Store,
    seen: Arc<RwLock<Seen>>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// How long a watch that failed waits before it is made again.
const REWATCH: Duration = Duration::from_secs(1);

impl Directory {
    /// The directory of node `node`, and the tasks keeping its cache (they run until aborted).
    pub(crate) fn start(
        node: String,
        leases: Arc<Leases>,
        nodes: kv::Store,
        members: kv::Store,
    ) -> (Arc<Self>, Vec<JoinHandle<()>>) {
        let seen: Arc<RwLock<Seen>> = Arc::default();
        let tasks = vec![
            tokio::spawn(watch_leases(leases.clone(), seen.clone())),
            tokio::spawn(watch_nodes(nodes.clone(), seen.clone())),
        ];
        let directory = Directory {
            node,
            leases,
            nodes,
            members,
            seen,
        };
        (Arc::new(directory), tasks)
    }

    /// The owner of `partition` (empty: none), from the cache, else from its key.
    pub(crate) async fn owner(&self, partition: u32) -> Result<String, String> {
        if let Some(owner) = self.seen.read().owners.get(&partition) {
            return Ok(owner.clone());
        }
        let lease = self
            .leases
            .read(partition)
            .await
            .map_err(|e| e.to_string())?;
        Ok(lease.map(|(l, _)| l.owner).unwrap_or_default())
    }
}

/// Every key of `kv` with its value, in key order; a key gone between the listing and its read
/// is left out. `what` names the bucket in errors.
async fn entries(kv: &kv::Store, what: &str) -> Result<Vec<(String, bytes::Bytes)>, Status> {
    let unavailable = |e: &dyn std::fmt::Display| Status::unavailable(format!("{what}: {e}"));
    let mut keys = kv.keys().await.map_err(|e| unavailable(&e))?;
    let mut ids = Vec::new();
    while let Some(key) = keys.next().await {
        ids.push(key.map_err(|e| unavailable(&e))?);
    }
    ids.sort();
    let mut out = Vec::new();
    for id in ids {
        if let Some(value) = kv.get(&id).await.map_err(|e| unavailable(&e))? {
            out.push((id, value));
        }
    }
    Ok(out)
}

/// Keeps `seen.owners` current; an entry that fails to decode is forgotten (read from the key
/// when needed).
async fn watch_leases(leases: Arc<Leases>, seen: Arc<RwLock<Seen>>) {
    loop {
        match leases.watch().await {
            Ok(watch) => {
                let mut watch = std::pin::pin!(watch);
                while let Some(change) = watch.next().await {
                    match change {
                        Ok((p, record)) => {
                            let owner = record.map(|r: LeaseRecord| r.owner).unwrap_or_default();
                            seen.write().owners.insert(p, owner);
                        }
                        // A key that is not a lease this version reads: left out (read from
                        // its key if it is a partition's).
                        Err(e @ LeaseError::Corrupt(_)) => {
                            tracing::debug!(error = %e, "lease watch: an entry passed over");
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "lease watch");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "lease watch not made"),
        }
        // Unknown while not watched: lookups read the keys.
        seen.write().owners.clear();
        tokio::time::sleep(REWATCH).await;
    }
}

/// Keeps `seen.addresses` current.
async fn watch_nodes(nodes: kv::Store, seen: Arc<RwLock<Seen>>) {
    loop {
        match nodes.watch_with_history(">").await {
            Ok(mut watch) => {
                while let Some(entry) = watch.next().await {
                    let Ok(entry) = entry else { break };
                    let mut seen = seen.write();
                    match entry.operation {
                        kv::Operation::Put => {
                            let address = String::from_utf8_lossy(&entry.value).to_string();
                            seen.addresses.insert(entry.key, address);
                        }
                        kv::Operation::Delete | kv::Operation::Purge => {
                            seen.addresses.remove(&entry.key);
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "node directory watch not made"),
        }
        seen.write().addresses.clear();
        tokio::time::sleep(REWATCH).await;
    }
}

#[tonic::async_trait]
impl Owners for Directory {
    fn node(&self) -> &str {
        &self.node
    }

    async fn nodes(&self) -> Result<Vec<(String, String)>, Status> {
        let entries = entries(&self.nodes, "the cluster's node directory").await?;
        Ok(entries
            .into_iter()
            .map(|(id, address)| (id, String::from_utf8_lossy(&address).to_string()))
            .collect())
    }

    async fn leases(&self, partitions: u32) -> Result<Vec<(String, u64)>, Status> {
        let mut out = Vec::new();
        for p in 0..partitions {
            let lease = self
                .leases
                .read(p)
                .await
                .map_err(|e| Status::unavailable(format!("the lease of partition {p}: {e}")))?;
            out.push(lease.map_or((String::new(), 0), |(l, _)| (l.owner, l.epoch)));
        }
        Ok(out)
    }

    async fn members(&self) -> Result<Vec<(String, Vec<PartitionCopy>)>, Status> {
        let entries = entries(&self.members, "the cluster's members").await?;
        Ok(entries
            .into_iter()
            .map(|(id, report)| (id, cluster_report::decode(&report)))
            .collect())
    }

    async fn owner_address(&self, partition: u32) -> Option<String> {
        // Asked after this node refused the partition: a cache naming this node is behind.
        let cached = self.seen.read().owners.get(&partition).cloned();
        let owner = match cached {
            Some(owner) if owner != self.node => owner,
            _ => {
                self.stale(partition);
                self.owner(partition).await.ok()?
            }
        };
        if owner.is_empty() || owner == self.node {
            return None;
        }
        if let Some(address) = self.seen.read().addresses.get(&owner) {
            return Some(address.clone());
        }
        let address = self.nodes.get(&owner).await.ok()??;
        String::from_utf8(address.to_vec()).ok()
    }

    fn stale(&self, partition: u32) {
        self.seen.write().owners.remove(&partition);
    }
}
