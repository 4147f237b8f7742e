//! The catalog's log (docs/cluster.md, "What is replicated"): every change to databases and
//! collections goes to one R3 stream, `MAYFLY_CATALOG`, and every node applies every entry in
//! the stream's order. Applying is deterministic (the same entries in the same order from the
//! same start give the same catalog, uids included, and the same answer), so an entry is checked
//! where it is applied, not where it is proposed: two nodes creating one collection at once
//! both publish, and on every node the first entry creates it and the second is refused.
//!
//! A node proposing a change publishes it and waits for its own applier to reach it; the
//! answer its applier got is the client's. Entries are opaque here: the server encodes them
//! (its requests) and applies them.

use std::{
    collections::HashMap,
    future::{Future, IntoFuture},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_nats::jetstream::{
    Context,
    consumer::{DeliverPolicy, pull::OrderedConfig},
    message::PublishMessage,
    stream::{self, Stream},
};
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

/// The catalog stream and its subject.
pub const CATALOG_STREAM: &str = "MAYFLY_CATALOG";
const CATALOG_SUBJECT: &str = "mayfly.catalog";

/// How long a proposal waits for its entry to be stored and applied here.
const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a proposed change has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogError {
    /// NATS did not take it: nothing changed.
    Unavailable(String),
    /// It may be in the log (no acknowledgement came), or it is and this node did not apply it
    /// in time: every node applies it or none does, but this one cannot say which yet.
    OutcomeUnknown(String),
}

impl std::fmt::Display for CatalogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogError::Unavailable(e) => write!(f, "the catalog log did not take it: {e}"),
            CatalogError::OutcomeUnknown(e) => {
                write!(f, "the catalog change's outcome is unknown: {e}")
            }
        }
    }
}

impl std::error::Error for CatalogError {}

/// What applies an entry on this node: its stream sequence and bytes in, the answer out.
pub type Apply<R> =
    Arc<dyn Fn(u64, Bytes) -> Pin<Box<dyn Future<Output = R> + Send>> + Send + Sync>;

/// This node's view of the catalog log.
pub struct CatalogLog<R> {
    js: Context,
    stream: Stream,
    /// The stream sequence of the last entry applied here.
    applied: watch::Sender<u64>,
    /// Proposals of this node waiting for their answer, by message id.
    waiting: Mutex<HashMap<String, oneshot::Sender<R>>>,
    /// Numbers this node's message ids.
    proposals: AtomicU64,
    node: String,
    /// When this process opened the log (ns since the epoch): part of its message ids.
    boot: u128,
}

/// Forgets a proposal's waiter when its wait ends.
struct Forget<'a, R> {
    waiting: &'a Mutex<HashMap<String, oneshot::Sender<R>>>,
    id: &'a str,
}

impl<R> Drop for Forget<'_, R> {
    fn drop(&mut self) {
        self.waiting.lock().remove(self.id);
    }
}

impl<R> std::fmt::Debug for CatalogLog<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogLog")
            .field("node", &self.node)
            .field("applied", &*self.applied.borrow())
            .finish_non_exhaustive()
    }
}

impl<R: Send + 'static> CatalogLog<R> {
    /// The catalog log (created where missing, R3 or `replicas`), for node `node`, which has
    /// applied it up to stream sequence `applied`.
    pub async fn open(
        js: &Context,
        replicas: usize,
        node: &str,
        applied: u64,
    ) -> Result<Arc<Self>, CatalogError> {
        let stream = js
            .get_or_create_stream(stream::Config {
                name: CATALOG_STREAM.to_string(),
                subjects: vec![CATALOG_SUBJECT.to_string()],
                num_replicas: replicas,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| CatalogError::Unavailable(e.to_string()))?;
        Ok(Arc::new(CatalogLog {
            js: js.clone(),
            stream,
            applied: watch::Sender::new(applied),
            waiting: Mutex::new(HashMap::new()),
            proposals: AtomicU64::new(0),
            node: node.to_string(),
            boot: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        }))
    }

    /// The stream sequence of the last entry applied here.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Waits until this node has applied the log up to stream sequence `seq`.
    pub async fn applied_to(&self, seq: u64) {
        let mut changed = self.applied.subscribe();
        // The sender lives in `self`: it is not dropped while waited on.
        let _ = changed.wait_for(|&applied| applied >= seq).await;
    }

    /// Where the log ends now (read from the stream leader).
    pub async fn end(&self) -> Result<u64, CatalogError> {
        let mut stream = self.stream.clone();
        let info = stream
            .info()
            .await
            .map_err(|e| CatalogError::Unavailable(e.to_string()))?;
        Ok(info.state.last_sequence)
    }

    /// Proposes `entry`: publishes it and returns the answer this node's applier got for it.
    pub async fn propose(&self, entry: Bytes) -> Result<R, CatalogError> {
        let n = self.proposals.fetch_add(1, Ordering::Relaxed);
        // Unique across restarts too: JetStream drops a message id it saw in the last two
        // minutes, and a restarted process may have the same pid.
        let id = format!("{}:{}:{n}", self.node, self.boot);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().insert(id.clone(), tx);
        // Removed however the wait ends, a caller that went away included.
        let _forget = Forget {
            waiting: &self.waiting,
            id: &id,
        };
        self.publish_and_wait(entry, &id, rx).await
    }

    async fn publish_and_wait(
        &self,
        entry: Bytes,
        id: &str,
        answer: oneshot::Receiver<R>,
    ) -> Result<R, CatalogError> {
        let publish = PublishMessage::build().payload(entry).message_id(id);
        let ack = self
            .js
            .send_publish(CATALOG_SUBJECT, publish)
            .await
            .map_err(|e| CatalogError::Unavailable(e.to_string()))?;
        match tokio::time::timeout(PROPOSAL_TIMEOUT, ack.into_future()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(CatalogError::OutcomeUnknown(e.to_string())),
            Err(_) => {
                return Err(CatalogError::OutcomeUnknown(
                    "no acknowledgement from NATS".into(),
                ));
            }
        }
        match tokio::time::timeout(PROPOSAL_TIMEOUT, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) | Err(_) => Err(CatalogError::OutcomeUnknown(format!(
                "stored in the catalog log, but not applied on node {} within {} s",
                self.node,
                PROPOSAL_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Applies every entry after the last applied one, in order, as they come, for as long as
    /// it runs: a consumer that fails (a NATS leader moving) is made again from where it got
    /// to.
    pub async fn follow(self: Arc<Self>, apply: Apply<R>) {
        loop {
            let why = self.clone().follow_once(apply.clone()).await;
            tracing::warn!(error = %why, applied = self.applied(), "catalog log: following again");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn follow_once(self: Arc<Self>, apply: Apply<R>) -> CatalogError {
        let config = OrderedConfig {
            filter_subject: CATALOG_SUBJECT.to_string(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: self.applied() + 1,
            },
            ..Default::default()
        };
        let consumer = match self.stream.create_consumer(config).await {
            Ok(consumer) => consumer,
            Err(e) => return CatalogError::Unavailable(e.to_string()),
        };
        let mut messages = match consumer.messages().await {
            Ok(messages) => messages,
            Err(e) => return CatalogError::Unavailable(e.to_string()),
        };
        while let Some(message) = messages.next().await {
            let message = match message {
                Ok(message) => message,
                Err(e) => return CatalogError::Unavailable(e.to_string()),
            };
            let seq = match message.info() {
                Ok(info) => info.stream_sequence,
                Err(e) => return CatalogError::Unavailable(e.to_string()),
            };
            if seq <= self.applied() {
                continue;
            }
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str().to_string());
            let answer = apply(seq, message.payload.clone()).await;
            if let Some(waiter) = id.and_then(|id| self.waiting.lock().remove(&id)) {
                let _ = waiter.send(answer);
            }
            self.applied.send_replace(seq);
        }
        CatalogError::Unavailable("the catalog log's consumer ended".into())
    }
}
