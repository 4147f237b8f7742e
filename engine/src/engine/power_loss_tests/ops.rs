//! The operations a sequence is made of, and how they are generated.

use std::sync::Arc;

use proptest::{collection::vec, prelude::*, sample::select};
use serde_json::{Map, Value, json};

use super::storage::Crash;
use super::*;

/// When the expiry rebuild runs after a restart. A server serves while it runs in the
/// background, and settings changes wait for it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rebuild {
    /// Before anything is read.
    First,
    /// After every address has been read once.
    AfterReads,
    /// Before the next settings change (as the catalog lock makes it): document operations
    /// and purges run meanwhile.
    Later,
}

/// Whether, and how, the client of an operation is told its outcome.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ack {
    /// Sync the log up to the outcome's position, then settle: the client is told.
    SyncThenSettle,
    /// Settle only if that completes at once, i.e. the log is already synced far enough.
    TrySettle,
    /// Never settled: the client never hears back (a timeout, a dropped connection).
    Drop,
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    Create {
        key: usize,
        ttl: Option<i64>,
        ack: Ack,
    },
    Upsert {
        key: usize,
        ttl: Option<i64>,
        ack: Ack,
    },
    Replace {
        key: usize,
        ttl: Option<i64>,
        ack: Ack,
    },
    Delete {
        key: usize,
        ack: Ack,
    },
    Touch {
        key: usize,
        ack: Ack,
    },
    Read {
        key: usize,
        ack: Ack,
    },
    /// Moves the clock forward by this many milliseconds.
    Advance(Millis),
    /// Replaces the collection's default TTL (raw: absent = Off, -1, n).
    SetDefault(Option<i64>),
    /// One purge batch on every shard; its deletes are forgotten once the log is synced.
    /// Batches of one shard may overlap here (a second before the first is durable), which
    /// `Shard::run_purge` never does: stricter than reality.
    Purge,
    /// Syncs this many thousandths of the unsynced log.
    Sync {
        permille: u64,
    },
    /// A crash, then a restart.
    Crash {
        crash: Crash,
        rebuild: Rebuild,
    },
}

fn ack() -> impl Strategy<Value = Ack> {
    prop_oneof![
        2 => Just(Ack::SyncThenSettle),
        2 => Just(Ack::TrySettle),
        1 => Just(Ack::Drop),
    ]
}

fn own_ttl() -> impl Strategy<Value = Option<i64>> {
    select(vec![None, None, Some(-1), Some(1), Some(2), Some(5)])
}

pub(super) fn default_ttl() -> impl Strategy<Value = Option<i64>> {
    select(vec![None, Some(-1), Some(1), Some(3), Some(10)])
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..KEYS, own_ttl(), ack()).prop_map(|(key, ttl, ack)| Op::Create { key, ttl, ack }),
        4 => (0..KEYS, own_ttl(), ack()).prop_map(|(key, ttl, ack)| Op::Upsert { key, ttl, ack }),
        2 => (0..KEYS, own_ttl(), ack()).prop_map(|(key, ttl, ack)| Op::Replace { key, ttl, ack }),
        2 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Delete { key, ack }),
        2 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Touch { key, ack }),
        3 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Read { key, ack }),
        4 => select(vec![1, 500, 999, 1_000, 1_001, 2_000, 5_000]).prop_map(Op::Advance),
        1 => default_ttl().prop_map(Op::SetDefault),
        1 => Just(Op::Purge),
        2 => prop_oneof![Just(1_000), 0..1_000u64].prop_map(|permille| Op::Sync { permille }),
        1 => (
            select(vec![Crash::PowerCut, Crash::PowerCut, Crash::ProcessKill]),
            select(vec![Rebuild::First, Rebuild::AfterReads, Rebuild::Later]),
        )
            .prop_map(|(crash, rebuild)| Op::Crash { crash, rebuild }),
    ]
}

pub(super) fn ops() -> impl Strategy<Value = Vec<Op>> {
    vec(op(), 20..=80)
}

pub(super) fn doc_key(key: usize) -> DocKey {
    DocKey {
        partition_key: PartitionKeyValue::String(PARTITIONS[key / IDS].into()),
        id: ResourceId::parse(IdKind::Document, &format!("d{}", key % IDS)).expect("valid id"),
    }
}

/// A body for `key`; `serial` makes every write's body distinct.
pub(super) fn body(key: usize, ttl: Option<i64>, serial: u64) -> DocumentBody {
    let mut map = Map::new();
    map.insert("id".into(), json!(format!("d{}", key % IDS)));
    map.insert("pk".into(), json!(PARTITIONS[key / IDS]));
    map.insert("n".into(), json!(serial));
    if let Some(ttl) = ttl {
        map.insert("ttl".into(), Value::from(ttl));
    }
    DocumentBody::parse(Arc::new(map), None).expect("valid body")
}
