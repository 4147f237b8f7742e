//! The operations a sequence is made of, and how they are generated.
//!
//! Documents are `{"id", "pk", "n", "v"?, "c"?, "ttl"?}`: `n` a number unique to each body
//! written (what `ORDER BY` sorts by), `v` a small value or absent (what equality queries look
//! for), `c` a counter that patches increment.

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

/// The values `v` takes: equality queries look for each.
pub(super) const VALUES: [i64; 3] = [0, 1, 2];

/// A condition value no document ever has: a patch with it fails `CONDITION_NOT_MET`.
pub(super) const NEVER: i64 = 9;

/// One operation of a patch, on a top-level path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PatchStep {
    /// `incr /c` by this; `c` is created with it if absent.
    Incr(i64),
    /// `set /v`.
    SetValue(i64),
    /// `remove /v`: fails the patch if `v` is absent.
    RemoveValue,
    /// `set /ttl`: the document's own TTL.
    SetTtl(i64),
    /// `remove /ttl`: fails the patch if the document has none.
    RemoveTtl,
}

/// A patch: its steps, and the condition `c.v = value` if any.
#[derive(Debug, Clone)]
pub(super) struct Patch {
    pub(super) steps: Vec<PatchStep>,
    pub(super) condition: Option<i64>,
}

/// What a batch operation does to document `d{id}` of the batch's partition.
#[derive(Debug, Clone)]
pub(super) enum BatchKind {
    Create {
        ttl: Option<i64>,
        value: Option<i64>,
    },
    Upsert {
        ttl: Option<i64>,
        value: Option<i64>,
    },
    Replace {
        ttl: Option<i64>,
        value: Option<i64>,
    },
    Delete,
    Read,
    Touch,
    Patch(Patch),
}

#[derive(Debug, Clone)]
pub(super) struct BatchStep {
    /// Which id of the partition: the key is `partition * IDS + id`.
    pub(super) id: usize,
    pub(super) kind: BatchKind,
}

/// Indexing policies (included, excluded paths): the default (everything), only the queried
/// paths, everything but `v`.
pub(super) const POLICIES: [(&[&str], &[&str]); 3] = [
    (&[], &[]),
    (&["/v/?", "/n/?"], &["/*"]),
    (&["/*"], &["/v/?"]),
];

/// Whether policy `policy` indexes `v`.
pub(super) fn indexes_value(policy: usize) -> bool {
    policy != 2
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    Create {
        key: usize,
        ttl: Option<i64>,
        value: Option<i64>,
        ack: Ack,
    },
    Upsert {
        key: usize,
        ttl: Option<i64>,
        value: Option<i64>,
        ack: Ack,
    },
    Replace {
        key: usize,
        ttl: Option<i64>,
        value: Option<i64>,
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
    Patch {
        key: usize,
        patch: Patch,
        ack: Ack,
    },
    /// A transactional batch on one partition: all of it or none.
    Batch {
        partition: usize,
        steps: Vec<BatchStep>,
        ack: Ack,
    },
    /// Replaces the indexing policy with `POLICIES[i]`: the index is rebuilt in the
    /// background, and queries read documents until it is complete.
    SetIndexing(usize),
    /// One round of the background indexer.
    Index,
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

fn value() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![Just(None), select(VALUES.to_vec()).prop_map(Some)]
}

fn patch_step() -> impl Strategy<Value = PatchStep> {
    prop_oneof![
        3 => select(vec![1, 2, -1]).prop_map(PatchStep::Incr),
        3 => select(VALUES.to_vec()).prop_map(PatchStep::SetValue),
        2 => Just(PatchStep::RemoveValue),
        1 => select(vec![-1, 1, 2, 5]).prop_map(PatchStep::SetTtl),
        1 => Just(PatchStep::RemoveTtl),
    ]
}

fn patch() -> impl Strategy<Value = Patch> {
    (
        vec(patch_step(), 1..=3),
        prop_oneof![3 => Just(None), 1 => select(VALUES.to_vec()).prop_map(Some)],
    )
        .prop_map(|(steps, condition)| Patch { steps, condition })
}

fn batch_kind() -> impl Strategy<Value = BatchKind> {
    prop_oneof![
        2 => (own_ttl(), value()).prop_map(|(ttl, value)| BatchKind::Create { ttl, value }),
        2 => (own_ttl(), value()).prop_map(|(ttl, value)| BatchKind::Upsert { ttl, value }),
        1 => (own_ttl(), value()).prop_map(|(ttl, value)| BatchKind::Replace { ttl, value }),
        1 => Just(BatchKind::Delete),
        1 => Just(BatchKind::Read),
        1 => Just(BatchKind::Touch),
        2 => patch().prop_map(BatchKind::Patch),
    ]
}

/// A batch's steps: an upsert first (so that most batches find a document to work on), then
/// steps mostly on the same document; a third end with a patch whose condition never holds,
/// so that the batch fails after staging writes (which must all be undone).
fn batch_steps() -> impl Strategy<Value = Vec<BatchStep>> {
    (0..IDS)
        .prop_flat_map(|first| {
            let id = prop_oneof![2 => Just(first), 1 => 0..IDS];
            (
                Just(first),
                (own_ttl(), value()),
                vec((id, batch_kind()), 0..=3),
                prop_oneof![2 => Just(None), 1 => (0..IDS).prop_map(Some)],
            )
        })
        .prop_map(|(first, (ttl, value), rest, doomed)| {
            let upsert = BatchStep {
                id: first,
                kind: BatchKind::Upsert { ttl, value },
            };
            let mut steps = vec![upsert];
            steps.extend(rest.into_iter().map(|(id, kind)| BatchStep { id, kind }));
            if let Some(id) = doomed {
                steps.push(BatchStep {
                    id,
                    kind: BatchKind::Patch(Patch {
                        steps: vec![PatchStep::Incr(1)],
                        condition: Some(NEVER),
                    }),
                });
            }
            steps
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..KEYS, own_ttl(), value(), ack())
            .prop_map(|(key, ttl, value, ack)| Op::Create { key, ttl, value, ack }),
        4 => (0..KEYS, own_ttl(), value(), ack())
            .prop_map(|(key, ttl, value, ack)| Op::Upsert { key, ttl, value, ack }),
        2 => (0..KEYS, own_ttl(), value(), ack())
            .prop_map(|(key, ttl, value, ack)| Op::Replace { key, ttl, value, ack }),
        2 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Delete { key, ack }),
        2 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Touch { key, ack }),
        3 => (0..KEYS, ack()).prop_map(|(key, ack)| Op::Read { key, ack }),
        3 => (0..KEYS, patch(), ack()).prop_map(|(key, patch, ack)| Op::Patch { key, patch, ack }),
        2 => (0..PARTITIONS.len(), batch_steps(), ack())
            .prop_map(|(partition, steps, ack)| Op::Batch { partition, steps, ack }),
        1 => (0..POLICIES.len()).prop_map(Op::SetIndexing),
        1 => Just(Op::Index),
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

/// A body for `key`, and the JSON object a read must return for it; `serial` makes every
/// write's body distinct (and is its `n`).
pub(super) fn body(
    key: usize,
    ttl: Option<i64>,
    value: Option<i64>,
    serial: u64,
) -> (DocumentBody, Map<String, Value>) {
    let mut map = Map::new();
    map.insert("id".into(), json!(format!("d{}", key % IDS)));
    map.insert("pk".into(), json!(PARTITIONS[key / IDS]));
    map.insert("n".into(), json!(serial));
    if let Some(value) = value {
        map.insert("v".into(), json!(value));
    }
    if let Some(ttl) = ttl {
        map.insert("ttl".into(), Value::from(ttl));
    }
    let expected = as_stored(&map);
    let body = DocumentBody::parse(Arc::new(map), None).expect("valid body");
    (body, expected)
}

/// `map` as it reads back once stored (numbers as the stored encoding gives them).
pub(super) fn as_stored(map: &Map<String, Value>) -> Map<String, Value> {
    mayfly_json::decode(&mayfly_json::encode(map))
}

/// The engine's operations for `patch`, and its condition.
pub(super) fn patch_request(patch: &Patch) -> (Vec<PatchOp>, Option<PatchCondition>) {
    let ops = patch
        .steps
        .iter()
        .map(|step| match *step {
            PatchStep::Incr(by) => PatchOp::Incr {
                path: "/c".into(),
                by: by.into(),
            },
            PatchStep::SetValue(value) => PatchOp::Set {
                path: "/v".into(),
                value: json!(value),
            },
            PatchStep::RemoveValue => PatchOp::Remove { path: "/v".into() },
            PatchStep::SetTtl(ttl) => PatchOp::Set {
                path: "/ttl".into(),
                value: json!(ttl),
            },
            PatchStep::RemoveTtl => PatchOp::Remove {
                path: "/ttl".into(),
            },
        })
        .collect();
    let condition = patch.condition.map(|value| {
        PatchCondition::parse(&format!("FROM c WHERE c.v = {value}")).expect("a valid condition")
    });
    (ops, condition)
}

/// Why the model expects a patch not to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PatchRefusal {
    /// Its condition does not hold.
    Condition,
    /// A step cannot apply (it removes what is absent).
    Step,
}

/// The model of a patch: `doc` as `patch` leaves it, written independently of the engine's
/// patch code for the few steps the test makes.
pub(super) fn patched(
    doc: &Map<String, Value>,
    patch: &Patch,
) -> Result<Map<String, Value>, PatchRefusal> {
    if let Some(value) = patch.condition
        && doc.get("v").and_then(Value::as_i64) != Some(value)
    {
        return Err(PatchRefusal::Condition);
    }
    let mut doc = doc.clone();
    for step in &patch.steps {
        match *step {
            PatchStep::Incr(by) => {
                let c = doc.get("c").and_then(Value::as_i64).unwrap_or(0);
                doc.insert("c".into(), json!(c + by));
            }
            PatchStep::SetValue(value) => {
                doc.insert("v".into(), json!(value));
            }
            PatchStep::SetTtl(ttl) => {
                doc.insert("ttl".into(), json!(ttl));
            }
            PatchStep::RemoveValue => {
                doc.remove("v").ok_or(PatchRefusal::Step)?;
            }
            PatchStep::RemoveTtl => {
                doc.remove("ttl").ok_or(PatchRefusal::Step)?;
            }
        }
    }
    Ok(as_stored(&doc))
}

/// A stored document's own TTL, raw, as its body has it.
pub(super) fn ttl_of(doc: &Map<String, Value>) -> Option<i64> {
    doc.get("ttl").and_then(Value::as_i64)
}
