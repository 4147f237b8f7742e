//! The account keys of a cluster (docs/cluster.md, "Security"): kept in the JetStream KV bucket
//! `mayfly-keys`, one key per slot, drawn by the first node to join; every node accepts the
//! same keys and the tokens they mint, and a key regenerated on any node is replaced there.
//!
//! A watch can lag while connected, so revocation is bounded by a check instead: every
//! [`CONFIRM_INTERVAL`] each node reads the four keys from the bucket's stream leader, and it
//! accepts keys only for [`SHARED_KEYS_TRUSTED_FOR`] after the start of its last read that
//! succeeded (past that, `UNAVAILABLE`, `KEYS_UNCONFIRMED`). A regeneration answers once that
//! bound and a confirming read have passed ([`REGENERATION_SETTLES`]): the new key then works
//! on every node, and the old one on none.
//!
//! Each node also writes the keys it holds to its data directory's `keys/` (as a single server
//! keeps them), so that an operator reads a key with `cat`.

use std::{path::PathBuf, sync::Arc, time::Duration};

use async_nats::jetstream::{self, stream::LastRawMessageErrorKind};
use futures_util::future::BoxFuture;
use tokio::{task::JoinHandle, time::Instant};

use crate::{
    auth::{KeyRing, KeySlot, SHARED_KEYS_TRUSTED_FOR, SecretsDir, SharedKeys, new_key},
    cluster_seal::ClusterSeal,
};

/// The bucket the keys are kept in.
pub(crate) const BUCKET: &str = "mayfly-keys";

/// How often a node confirms the keys it holds with the bucket's leader.
const CONFIRM_INTERVAL: Duration = Duration::from_millis(500);

/// The longest a confirming read may take: it confirms from when it began.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a regeneration waits, once the new key is in the bucket, before it answers: by
/// then every node that reads the bucket has read the new key (a read that began after the
/// put starts within a read and an interval, and ends within a read more), and none trusts a
/// read from before it ([`SHARED_KEYS_TRUSTED_FOR`]); a node that cannot read it refuses
/// every key, retryably. So when the answer comes, the new key works on every node and the
/// old one on none.
const REGENERATION_SETTLES: Duration = Duration::from_millis(2_500);

/// Replaces keys in the bucket, and in this node's copy.
#[derive(Debug)]
struct BucketKeys {
    kv: jetstream::kv::Store,
    copies: Option<SecretsDir>,
    seal: Arc<ClusterSeal>,
}

impl SharedKeys for BucketKeys {
    fn replace(&self, slot: KeySlot, key: String) -> BoxFuture<'static, Result<(), String>> {
        let (kv, copies) = (self.kv.clone(), self.copies.clone());
        let sealed = self.seal.seal(slot.file_name(), key.as_bytes());
        Box::pin(async move {
            kv.put(slot.file_name(), sealed.into())
                .await
                .map_err(|e| e.to_string())?;
            // The copy too before answering, as a single server writes its key file (the
            // other nodes write theirs when they next confirm the keys).
            if let Some(copies) = copies {
                let written =
                    tokio::task::spawn_blocking(move || copies.replace(slot.file_name(), &key))
                        .await;
                if !matches!(written, Ok(Ok(()))) {
                    tracing::warn!(
                        "cluster keys: the copy of the regenerated {slot} was not written"
                    );
                }
            }
            Ok(())
        })
    }

    fn settles_in(&self) -> Duration {
        REGENERATION_SETTLES
    }
}

/// The cluster's keys from `kv` (drawn now by whichever node asks first), and the task that
/// keeps confirming them; each change is copied to `copy_to`'s `keys/` if given.
pub(crate) async fn open(
    kv: jetstream::kv::Store,
    copy_to: Option<PathBuf>,
    seal: Arc<ClusterSeal>,
) -> Result<(Arc<KeyRing>, JoinHandle<()>), String> {
    for slot in KeySlot::ALL {
        // Only the first node's draw is kept: `create` refuses a key that exists.
        let drawn = seal.seal(slot.file_name(), new_key().as_bytes());
        let _ = kv.create(slot.file_name(), drawn.into()).await;
    }
    let started = Instant::now();
    let keys = read_all(&kv, &seal).await?;
    let copies = copy_to.and_then(|dir| {
        std::fs::create_dir_all(&dir)
            .and_then(|()| SecretsDir::open(&dir))
            .inspect_err(|e| {
                tracing::warn!(error = %e, dir = %dir.display(), "cluster keys: no copy kept");
            })
            .ok()
    });
    copy(copies.as_ref(), &keys);
    let store = Arc::new(BucketKeys {
        kv: kv.clone(),
        copies: copies.clone(),
        seal: seal.clone(),
    });
    let ring = Arc::new(KeyRing::shared(keys, store, started.into_std()));
    let task = tokio::spawn(confirm(kv, ring.clone(), copies, seal));
    Ok((ring, task))
}

/// Reads the keys from the bucket's leader every [`CONFIRM_INTERVAL`], for as long as the node
/// runs.
async fn confirm(
    kv: jetstream::kv::Store,
    ring: Arc<KeyRing>,
    copies: Option<SecretsDir>,
    seal: Arc<ClusterSeal>,
) {
    let mut held: Option<[String; 4]> = None;
    let mut failing = false;
    loop {
        tokio::time::sleep(CONFIRM_INTERVAL).await;
        let started = Instant::now();
        match tokio::time::timeout(READ_TIMEOUT, read_all(&kv, &seal)).await {
            Ok(Ok(keys)) => {
                if held.as_ref() != Some(&keys) {
                    // Files written and fsynced: off the async workers.
                    let (copies, written) = (copies.clone(), keys.clone());
                    let _ =
                        tokio::task::spawn_blocking(move || copy(copies.as_ref(), &written)).await;
                    held = Some(keys.clone());
                }
                ring.confirmed(keys.map(Some), started.into_std());
                if failing {
                    tracing::info!("cluster keys confirmed again");
                    failing = false;
                }
            }
            Ok(Err(e)) if !failing => {
                tracing::warn!(error = %e, "cluster keys: cannot confirm them; keys are refused {} s after the last confirmation", SHARED_KEYS_TRUSTED_FOR.as_secs());
                failing = true;
            }
            Err(_) if !failing => {
                tracing::warn!(
                    "cluster keys: reading them took longer than {} s; keys are refused {} s after the last confirmation",
                    READ_TIMEOUT.as_secs(),
                    SHARED_KEYS_TRUSTED_FOR.as_secs()
                );
                failing = true;
            }
            _ => {}
        }
    }
}

/// The four keys as the bucket's stream leader has them (a KV read may be answered by a
/// replica that lags).
async fn read_all(kv: &jetstream::kv::Store, seal: &ClusterSeal) -> Result<[String; 4], String> {
    let mut keys: [String; 4] = Default::default();
    for (slot, key) in KeySlot::ALL.into_iter().zip(keys.iter_mut()) {
        let subject = format!("$KV.{BUCKET}.{}", slot.file_name());
        let message = kv
            .stream
            .get_last_raw_message_by_subject(&subject)
            .await
            .map_err(|e| match e.kind() {
                LastRawMessageErrorKind::NoMessageFound => format!("the {slot} is missing"),
                _ => format!("reading the {slot}: {e}"),
            })?;
        let opened = seal.open(slot.file_name(), &message.payload)?;
        *key = String::from_utf8(opened).map_err(|_| format!("the {slot} is not text"))?;
        if key.is_empty() {
            return Err(format!("the {slot} was deleted"));
        }
    }
    Ok(keys)
}

fn copy(copies: Option<&SecretsDir>, keys: &[String; 4]) {
    let Some(copies) = copies else { return };
    for (slot, key) in KeySlot::ALL.into_iter().zip(keys) {
        if let Err(e) = copies.replace(slot.file_name(), key) {
            tracing::warn!(error = %e, "cluster keys: the copy of the {slot} was not written");
        }
    }
}
