//! Forwarding in a cluster (docs/cluster.md, "Request routing"): a node answers any request;
//! a document request for a partition another node owns is sent on to that node, once, with
//! the caller's credentials, and its answer returned as is. A forwarded request carries
//! `mayfly-forwarded: <node>`; a node that does not own its partition either answers
//! `NOT_OWNER` rather than forwarding again (the map moved meanwhile: the client retries).
//!
//! Unary document calls are forwarded; queries and read feeds go across nodes in `cluster_reads`; change
//! feeds across nodes come later.

use std::{collections::HashMap, future::Future, sync::Arc};

use mayfly_proto::v1::client::DocumentsClient;
use parking_lot::Mutex;
use tonic::{
    Request, Response, Status,
    metadata::{MetadataMap, MetadataValue},
    transport::{Channel, ClientTlsConfig, Endpoint},
};

use super::DocumentsService;
use crate::cluster_report::PartitionCopy;

/// Metadata naming the node that forwarded a request.
pub const FORWARDED: &str = "mayfly-forwarded";

/// The longest a forwarded call waits for the owner: a few leases, so that a call sent to an
/// owner that has stopped answering (dead, or paused) gives way to a retry that finds the
/// partition's next owner.
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest a forwarding node waits to connect to an owner.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Metadata of a `NOT_OWNER` status: the partition the request is for.
pub const PARTITION: &str = "mayfly-partition";

/// Where a partition is served: the cluster's map of owners and node addresses.
#[tonic::async_trait]
pub trait Owners: Send + Sync + std::fmt::Debug {
    /// This node's id.
    fn node(&self) -> &str;

    /// The gRPC address (`http://host:port`) of the node that owns `partition` now, if it is
    /// known and is not this node.
    async fn owner_address(&self, partition: u32) -> Option<String>;

    /// The nodes of the cluster: (id, address), in id order.
    async fn nodes(&self) -> Result<Vec<(String, String)>, Status>;

    /// Each of `partitions` partitions' lease: (owner, epoch); an empty owner for none.
    async fn leases(&self, partitions: u32) -> Result<Vec<(String, u64)>, Status>;

    /// The nodes in the member list (live), each with its copies as its last heartbeat
    /// reported them, in id order.
    async fn members(&self) -> Result<Vec<(String, Vec<PartitionCopy>)>, Status>;

    /// The node a request for `partition` was forwarded to does not own it: what this node
    /// believed of it is out of date.
    fn stale(&self, _partition: u32) {}
}

/// Sends requests on to the nodes that own their partitions.
#[derive(Debug, Clone)]
pub struct Forwarder {
    owners: Arc<dyn Owners>,
    /// One connection per node address.
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// TLS to the other nodes (`https://` addresses), when this node serves TLS.
    tls: Option<ClientTlsConfig>,
}

impl Forwarder {
    /// Forwards to the owners `owners` names, over TLS checked by `tls` if given.
    pub fn new(owners: Arc<dyn Owners>, tls: Option<ClientTlsConfig>) -> Self {
        Forwarder {
            owners,
            channels: Arc::default(),
            tls,
        }
    }

    pub(super) fn channel(&self, address: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock();
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        // A paused or unreachable owner fails the call in bounded time (the caller's deadline
        // travels with it too, as `grpc-timeout`): the client retries, and finds the new
        // owner once the lease has moved.
        let mut endpoint = Endpoint::from_shared(address.to_string())
            .map_err(|e| Status::internal(format!("node address {address}: {e}")))?;
        if let Some(tls) = &self.tls {
            // A node of a TLS cluster advertising plaintext (misconfigured, or a forged
            // directory entry) gets nothing: the caller's key would travel in clear.
            if !address.starts_with("https://") {
                return Err(Status::unavailable(format!(
                    "node address {address} is not https://: this node forwards over TLS only"
                )));
            }
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| Status::internal(format!("TLS to node {address}: {e}")))?;
        }
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(FORWARD_TIMEOUT)
            .connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }
}

impl Forwarder {
    /// This node's id.
    pub(super) fn node(&self) -> &str {
        self.owners.node()
    }

    /// The address of the node that owns `partition`, if known and not this node.
    pub(super) async fn owner_address(&self, partition: u32) -> Option<String> {
        self.owners.owner_address(partition).await
    }

    /// What this node believed of `partition`'s owner is out of date.
    pub(super) fn stale(&self, partition: u32) {
        self.owners.stale(partition)
    }
}

/// The partition a `NOT_OWNER` status names.
pub(super) fn not_owned(status: &Status) -> Option<u32> {
    status
        .metadata()
        .get(PARTITION)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// What a forwarded request keeps of the caller's: credentials and deadline.
pub(super) fn forwarded_metadata(from: &MetadataMap, node: &str) -> MetadataMap {
    let mut out = MetadataMap::new();
    for key in ["authorization", "grpc-timeout"] {
        if let Some(value) = from.get(key) {
            out.insert(key, value.clone());
        }
    }
    if let Ok(node) = MetadataValue::try_from(node) {
        out.insert(FORWARDED, node);
    }
    out
}

impl DocumentsService {
    /// Answers `request` here, or, when its partition is another node's, there.
    pub(super) async fn routed<T, U, Here, There, ThereFuture>(
        &self,
        request: Request<T>,
        here: impl Fn(Request<T>) -> Here,
        there: There,
    ) -> Result<Response<U>, Status>
    where
        T: Clone,
        Here: Future<Output = Result<Response<U>, Status>>,
        There: FnOnce(DocumentsClient<Channel>, Request<T>) -> ThereFuture,
        ThereFuture: Future<Output = Result<Response<U>, Status>>,
    {
        let Some(forwarder) = &self.forwarder else {
            return here(request).await;
        };
        // A forwarded request is answered here or refused: never sent on again.
        let forwarded = request.metadata().get(FORWARDED).is_some();
        let copy = (request.metadata().clone(), request.get_ref().clone());
        let extensions = request.extensions().clone();
        let mut answer = here(request).await;
        if let Err(status) = &answer
            && catalog_missing(status)
            && self.catalog.caught_up(CATALOG_WAIT).await
        {
            // Its collection (or database) was made on another node a moment ago: asked
            // again now that this node has applied the catalog as far as it goes.
            let (metadata, message) = copy.clone();
            answer = here(Request::from_parts(metadata, extensions, message)).await;
        }
        let copy = (!forwarded).then_some(copy);
        let (Err(status), Some((metadata, message))) = (&answer, copy) else {
            return answer;
        };
        let Some(partition) = not_owned(status) else {
            return answer;
        };
        let Some(address) = forwarder.owners.owner_address(partition).await else {
            return answer;
        };
        // Whatever this node takes and answers, the owner's answer passes through.
        let client = DocumentsClient::new(forwarder.channel(&address)?)
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::MAX_MESSAGE_BYTES);
        let mut forwarded = Request::new(message);
        *forwarded.metadata_mut() = forwarded_metadata(&metadata, forwarder.owners.node());
        there(client, forwarded)
            .await
            .inspect_err(|status| {
                if not_owned(status).is_some() {
                    forwarder.owners.stale(partition);
                }
            })
            .map_err(|status| match status.code() {
                // The owner did not answer in time (this node's timeout, not the caller's), or the
                // connection to it failed (a transport error: no Mayfly status, which always says
                // why): what it did is unknown, and a retry finds the partition's owner again.
                tonic::Code::Cancelled | tonic::Code::DeadlineExceeded | tonic::Code::Unknown => {
                    unknown_outcome(partition, &address, &status)
                }
                tonic::Code::Unavailable if status.details().is_empty() => {
                    unknown_outcome(partition, &address, &status)
                }
                _ => status,
            })
    }
}

/// How long a request naming a collection this node does not know waits for the catalog log.
const CATALOG_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether `status` says the request's database or collection does not exist (here).
fn catalog_missing(status: &Status) -> bool {
    use tonic_types::StatusExt;
    status.code() == tonic::Code::NotFound
        && status.get_error_details().error_info().is_some_and(|info| {
            matches!(
                info.reason.as_str(),
                "COLLECTION_NOT_FOUND" | "DATABASE_NOT_FOUND"
            )
        })
}

/// The status of a forwarded call whose owner did not answer (in time, or at all): what it
/// did is unknown.
fn unknown_outcome(partition: u32, address: &str, status: &Status) -> Status {
    super::status::to_status(crate::engine::Error::Storage(
        crate::storage::StorageError::outcome_unknown(format!(
            "partition {partition}'s owner at {address} did not answer ({}; this node waits {} s): it may be stopped or gone, and the call may or may not have been applied; retry",
            status.message(),
            FORWARD_TIMEOUT.as_secs()
        )),
    ))
}
