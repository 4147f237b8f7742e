//! The reference model: the TTL rules, written independently of the engine's, and what each
//! document address went through since the last restart.

use std::collections::HashSet;

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Map, Value};

use super::ops::{doc_key, ttl_of};
use super::*;

/// When a version expires (SPEC §3): `None` = never. Raw TTLs: default absent = Off, -1 = on
/// without a default, n; own -1 = never, m.
pub(super) fn expiry(last_write: Millis, own: Option<i64>, default: Option<i64>) -> Option<Millis> {
    let seconds = match (default, own) {
        (None, _) | (_, Some(-1)) | (Some(-1), None) => return None,
        (_, Some(m)) => m,
        (Some(n), None) => n,
    };
    let seconds = u64::try_from(seconds).expect("TTLs other than -1 are positive");
    Some(last_write + seconds * 1_000)
}

/// One version ever written.
#[derive(Debug)]
pub(super) struct Version {
    pub(super) etag: u64,
    pub(super) last_write: Millis,
    pub(super) ttl: Option<i64>,
    pub(super) body: Bytes,
    /// The body as the model says it must read: what was sent, or what the model's patch
    /// made of the version before.
    pub(super) doc: Map<String, Value>,
    /// Expired at some instant under the default in force then: final.
    pub(super) expired: bool,
}

/// A write since the last restart.
#[derive(Debug, Clone, Copy)]
struct Write {
    /// The state it left: a version index, `None` = absent.
    state: Option<usize>,
    /// Its position in the storage's log, as the storage counts (not as the engine says).
    at: u64,
    /// A client was told of it.
    acked: bool,
}

/// What a document address went through since the last restart.
#[derive(Debug, Default, Clone)]
pub(super) struct History {
    /// The state at the last restart: durable.
    base: Option<usize>,
    writes: Vec<Write>,
}

impl History {
    fn current(&self) -> Option<usize> {
        self.writes.last().map_or(self.base, |w| w.state)
    }

    /// The states the acknowledged writes allow after a crash (from the last acknowledged
    /// write on), and whether any write was acknowledged (if none, every state since the
    /// restart).
    pub(super) fn allowed(&self) -> (Vec<Option<usize>>, bool) {
        match self.writes.iter().rposition(|w| w.acked) {
            Some(i) => (self.writes[i..].iter().map(|w| w.state).collect(), true),
            None => (
                std::iter::once(self.base)
                    .chain(self.writes.iter().map(|w| w.state))
                    .collect(),
                false,
            ),
        }
    }

    /// The state a log kept up to `kept` holds: the last write at or before it.
    pub(super) fn kept(&self, kept: Lsn) -> Option<usize> {
        self.writes
            .iter()
            .rev()
            .find(|w| w.at <= kept.0)
            .map_or(self.base, |w| w.state)
    }

    fn push(&mut self, state: Option<usize>, at: u64) -> Result<(), TestCaseError> {
        let last = self.writes.last().map_or(0, |w| w.at);
        prop_assert!(at > last, "write at position {} after one at {}", at, last);
        self.writes.push(Write {
            state,
            at,
            acked: false,
        });
        Ok(())
    }
}

#[derive(Debug)]
pub(super) struct Model {
    /// The collection's default TTL, raw.
    default: Option<i64>,
    versions: Vec<Version>,
    keys: Vec<History>,
    /// Etags a client may have seen, or that survived a crash: never to be handed out again.
    acknowledged_etags: HashSet<u64>,
    /// Etags handed out since the last restart.
    run_etags: HashSet<u64>,
}

impl Model {
    pub(super) fn new(default: Option<i64>) -> Self {
        Model {
            default,
            versions: Vec::new(),
            keys: vec![History::default(); KEYS],
            acknowledged_etags: HashSet::new(),
            run_etags: HashSet::new(),
        }
    }

    pub(super) fn default(&self) -> Option<i64> {
        self.default
    }

    /// A settings change to default `raw` at `now`.
    pub(super) fn set_default(&mut self, raw: Option<i64>, now: Millis) {
        self.default = raw;
        self.judge(now);
    }

    pub(super) fn version(&self, v: usize) -> &Version {
        &self.versions[v]
    }

    /// The version with `etag` that `key` held since the last restart, if any. Only there is
    /// an etag unique: a restart may hand out again those of writes it lost.
    pub(super) fn find(&self, key: usize, etag: u64) -> Option<usize> {
        let history = &self.keys[key];
        std::iter::once(history.base)
            .chain(history.writes.iter().map(|w| w.state))
            .flatten()
            .find(|&v| self.versions[v].etag == etag)
    }

    pub(super) fn history(&self, key: usize) -> &History {
        &self.keys[key]
    }

    /// Marks every version that is expired at `now` under the current default as expired for
    /// good. Time moves only at advances and defaults change only at settings changes, so
    /// judging after each of them (and after each write) misses no instant under any default.
    /// Overwritten versions are judged too: a crash may bring them back.
    pub(super) fn judge(&mut self, now: Millis) {
        let default = self.default;
        for v in &mut self.versions {
            if !v.expired && expiry(v.last_write, v.ttl, default).is_some_and(|e| now >= e) {
                v.expired = true;
            }
        }
    }

    pub(super) fn visible(&self, version: usize, now: Millis) -> bool {
        let v = &self.versions[version];
        !v.expired && expiry(v.last_write, v.ttl, self.default).is_none_or(|e| now < e)
    }

    /// A state as a read at `now` must show it: the version if visible, else absent.
    pub(super) fn seen(&self, state: Option<usize>, now: Millis) -> Option<usize> {
        state.filter(|&v| self.visible(v, now))
    }

    /// A state, for failure messages.
    pub(super) fn describe(&self, state: Option<usize>, now: Millis) -> String {
        match state {
            None => "absent".to_owned(),
            Some(v) => format!(
                "etag {} {}",
                self.versions[v].etag,
                if self.visible(v, now) {
                    "(visible)"
                } else {
                    "(expired)"
                }
            ),
        }
    }

    /// The live version at `key`, before any crash: the engine holds every write applied.
    pub(super) fn live(&self, key: usize, now: Millis) -> Option<usize> {
        self.seen(self.keys[key].current(), now)
    }

    /// Checks a view of version `v` at `key` against the model, under the current default.
    pub(super) fn check_view(
        &self,
        view: &DocumentView,
        key: usize,
        v: usize,
    ) -> Result<(), TestCaseError> {
        let version = &self.versions[v];
        prop_assert_eq!(&view.key, &doc_key(key));
        prop_assert_eq!(view.etag.0, version.etag);
        prop_assert_eq!(&view.body, &version.body);
        prop_assert_eq!(&view.body_map(), &version.doc);
        prop_assert_eq!(view.last_write, version.last_write);
        prop_assert_eq!(raw_ttl(view.ttl), version.ttl);
        prop_assert_eq!(
            view.expires_at,
            expiry(version.last_write, version.ttl, self.default)
        );
        Ok(())
    }

    /// The body version `v` must read as.
    pub(super) fn doc(&self, v: usize) -> &Map<String, Value> {
        &self.versions[v].doc
    }

    /// Records a write of a new version at `key`, at log position `at`, checking what the
    /// engine returned against `doc`, the body the model expects.
    pub(super) fn put(
        &mut self,
        key: usize,
        view: &DocumentView,
        doc: Map<String, Value>,
        now: Millis,
        at: u64,
    ) -> Result<(), TestCaseError> {
        let v = self.new_version(key, view, doc, now)?;
        self.record(key, Some(v), at)?;
        self.judge(now);
        Ok(())
    }

    /// Records a new version at `key` that the engine returned, checking it against `doc`,
    /// without placing it in the key's history: a batch hands out versions that only its
    /// last write of a key stores.
    pub(super) fn new_version(
        &mut self,
        key: usize,
        view: &DocumentView,
        doc: Map<String, Value>,
        now: Millis,
    ) -> Result<usize, TestCaseError> {
        let ttl = ttl_of(&doc);
        let etag = view.etag.0;
        prop_assert!(
            !self.acknowledged_etags.contains(&etag),
            "etag {} handed out again although it was acknowledged (or survived a crash) before",
            view.etag
        );
        prop_assert!(
            self.run_etags.insert(etag),
            "etag {} handed out twice since the last restart",
            view.etag
        );
        prop_assert_eq!(&view.key, &doc_key(key));
        prop_assert_eq!(view.last_write, now);
        prop_assert_eq!(raw_ttl(view.ttl), ttl);
        prop_assert_eq!(view.expires_at, expiry(now, ttl, self.default));
        prop_assert_eq!(&view.body_map(), &doc, "the body read back");
        self.versions.push(Version {
            etag,
            last_write: now,
            ttl,
            body: view.body.clone(),
            doc,
            expired: false,
        });
        Ok(self.versions.len() - 1)
    }

    /// Records that the write at log position `at` left `key` in `state` (a version from
    /// [`Model::new_version`], or absent: a delete).
    pub(super) fn record(
        &mut self,
        key: usize,
        state: Option<usize>,
        at: u64,
    ) -> Result<(), TestCaseError> {
        self.keys[key].push(state, at)
    }

    /// A client was told of version `v` (a batch's intermediate versions, which no key
    /// holds): its etag is never to be handed out again.
    pub(super) fn acknowledge_version(&mut self, v: usize) {
        self.acknowledged_etags.insert(self.versions[v].etag);
    }

    /// A client was told an outcome at `key`: the state it reflects, the one the latest write
    /// there left, must survive a crash. A write's own outcome, a read of it, and a NOT_FOUND
    /// or EXISTS that reflects it all settle at (or after) that write's position.
    pub(super) fn acknowledge(&mut self, key: usize) {
        if let Some(write) = self.keys[key].writes.last_mut() {
            write.acked = true;
            if let Some(v) = write.state {
                self.acknowledged_etags.insert(self.versions[v].etag);
            }
        }
    }

    /// A restart: the etags of the run before may be handed out again unless acknowledged.
    pub(super) fn clear_run_etags(&mut self) {
        self.run_etags.clear();
    }

    /// After a crash `key` holds `state`, durable: the base of its new history. A version
    /// that survived a crash is never to be handed out again.
    pub(super) fn restart_key(&mut self, key: usize, state: Option<usize>) {
        if let Some(v) = state {
            self.acknowledged_etags.insert(self.versions[v].etag);
        }
        self.keys[key] = History {
            base: state,
            writes: Vec::new(),
        };
    }
}
