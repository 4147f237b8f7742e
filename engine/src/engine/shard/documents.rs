//! Document requests on one shard: put, touch, delete and read, each one check-and-write
//! under the shard lock, with bodies fetched outside it where possible.

#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;
use crate::engine::index::terms::bounded_document_terms;
use serde_json::{Map, Value};

impl Shard {
    /// Creates, upserts or replaces a document. `terms` are its index terms under the policy
    /// given with them, if computed. If the version it replaces has index entries, their terms
    /// are read outside the lock first, and used if that version is still the one there. In a
    /// `lazy` collection neither is needed: the background indexer updates the entries.
    #[allow(
        clippy::too_many_arguments,
        reason = "one argument per part of a write request"
    )]
    pub(crate) fn put(
        &self,
        info: &CollectionInfo,
        key: DocKey,
        (body, map, ttl): (Bytes, &Map<String, Value>, Option<DocumentTtl>),
        (policy, mut terms): (Option<Arc<IndexPaths>>, Option<Vec<Term>>),
        mode: WriteMode,
        if_match: Option<&str>,
        version: u64,
        clock: &dyn Clock,
    ) -> Outcome<(DocumentView, bool)> {
        let mut old_terms: Option<(TermsRef, Vec<Term>)> = None;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut state = self.lock();
            let st = &mut *state;
            let now = st.now(clock);
            let Some(cs) = st.collections.get(&info.uid) else {
                return Outcome::failed(collection_gone(info));
            };
            // A refusal reflects what this shard holds: it settles like a read of it.
            let seen = observed(st, cs);
            let slot = cs.index.get(&key).copied();
            let live = slot.filter(|&s| st.docs.get(s).is_visible(&cs.rules, now));
            match (mode, live) {
                (WriteMode::Create, Some(_)) => {
                    return Outcome::new(
                        Err(Error::DocumentExists {
                            id: key.id.to_string(),
                            partition_key: key.partition_key,
                        }),
                        seen,
                    );
                }
                (WriteMode::Replace, None) => {
                    return Outcome::new(
                        Err(Error::DocumentNotFound {
                            id: key.id.to_string(),
                            partition_key: key.partition_key,
                        }),
                        seen,
                    );
                }
                _ => {}
            }
            if let Err(e) = check_if_match(if_match, live.map(|s| st.docs.get(s)), &key) {
                return Outcome::new(Err(e), seen);
            }
            let created = live.is_none();
            let record = |key, body| StoredDocument {
                collection: info.uid,
                key,
                body,
                last_write: now,
                version,
                ttl,
            };
            if cs.lazy && cs.policy.is_some() {
                return self
                    .write_version(state, slot, record(key, body), IndexChange::Owed)
                    .map(|view| (view, created));
            }
            if terms.is_none() || !same_policy(cs.policy.as_ref(), policy.as_ref()) {
                // Not computed, or under another policy: a short compute here.
                terms = Some(match &cs.policy {
                    Some(p) => match bounded_document_terms(map, p) {
                        Ok(terms) => terms,
                        Err(e) => return Outcome::new(Err(e.into()), seen),
                    },
                    None => Vec::new(),
                });
            }
            let old = match slot {
                Some(s) if st.docs.get(s).indexed => {
                    let current = st.docs.terms_ref(s);
                    match old_terms.take() {
                        Some((r, t)) if r == current => t,
                        _ if attempt < MAX_OPTIMISTIC_ATTEMPTS => {
                            drop(state);
                            match self.store.get_terms(info.uid, &key) {
                                Ok(t) => {
                                    old_terms =
                                        Some((current, t.map(|t| t.terms).unwrap_or_default()))
                                }
                                Err(e) => return Outcome::failed(e),
                            }
                            continue;
                        }
                        // Rewritten under every attempt so far: read while holding the lock, once.
                        _ => match self.store.get_terms(info.uid, &key) {
                            Ok(t) => t.map(|t| t.terms).unwrap_or_default(),
                            Err(e) => return Outcome::failed(e),
                        },
                    }
                }
                _ => Vec::new(),
            };
            let new = terms.take().unwrap_or_default();
            return self
                .write_version(
                    state,
                    slot,
                    record(key, body),
                    IndexChange::Replace(old, new),
                )
                .map(|view| (view, created));
        }
    }

    /// Stores a new version of a document through the commit path, then views it as of its
    /// write: the common end of put and touch.
    fn write_version(
        &self,
        mut state: MutexGuard<'_, ShardState>,
        slot: Option<u32>,
        record: StoredDocument,
        index: IndexChange,
    ) -> Outcome<DocumentView> {
        let owed = matches!(index, IndexChange::Owed);
        let st = &mut *state;
        let record = Arc::new(record);
        let change = Change::Put {
            slot,
            record: record.clone(),
            index,
        };
        let (deadline, lsn) =
            match st.commit(&*self.store, &[change], &self.metrics, &self.versions) {
                Ok(done) => done,
                Err(e) => return Outcome::failed(e),
            };
        st.client_lsn = lsn;
        let cs = &st.collections[&record.collection];
        let view = view(&record, cs.rules.default_ttl, record.last_write);
        let settle_at = lsn.max(cs.settings_lsn);
        drop(state);
        self.wake_purge_for(deadline);
        if owed {
            self.indexer_wake.notify_one();
        }
        Outcome::new(Ok(view), settle_at)
    }

    /// Rewrites a live document with its current body: a write that restarts its TTL clock.
    /// The body is read outside the lock and the write made only if the document is still that
    /// version (else it is read again).
    pub(crate) fn touch(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        if_match: Option<&str>,
        version: u64,
        clock: &dyn Clock,
    ) -> Outcome<DocumentView> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let read = if attempt < MAX_OPTIMISTIC_ATTEMPTS {
                match self.read(info, key, clock) {
                    Outcome {
                        result: Ok(view), ..
                    } => Some(view),
                    failed => return failed,
                }
            } else {
                None
            };
            let mut state = self.lock();
            let st = &mut *state;
            let now = st.now(clock);
            let slot = match writable_slot(st, info, key, if_match, now) {
                Ok(slot) => slot,
                Err((e, seen)) => return Outcome::new(Err(e), seen),
            };
            let current = match read {
                Some(view) if view.etag.0 == st.docs.get(slot).version => (view.body, view.ttl),
                // Written since it was read: read it again.
                Some(_) => continue,
                // Rewritten under every attempt so far: fetch while holding the lock, once.
                None => match self.store.get(info.uid, key) {
                    Ok(Some(record)) => (record.body.clone(), record.ttl),
                    Ok(None) => return Outcome::failed(missing_record(key)),
                    Err(e) => return Outcome::failed(e),
                },
            };
            let record = StoredDocument {
                collection: info.uid,
                key: key.clone(),
                body: current.0,
                last_write: now,
                version,
                ttl: current.1,
            };
            // The same body: its index entries stay as they are.
            return self.write_version(state, Some(slot), record, IndexChange::Unchanged);
        }
    }

    /// Deletes a live document, with its index entries (their terms read outside the lock
    /// first, as for a put).
    pub(crate) fn delete(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        if_match: Option<&str>,
        clock: &dyn Clock,
    ) -> Outcome<()> {
        let mut old_terms: Option<(TermsRef, Vec<Term>)> = None;
        let mut attempt = 0;
        let (mut state, slot, terms) = loop {
            attempt += 1;
            let mut state = self.lock();
            let st = &mut *state;
            let now = st.now(clock);
            let slot = match writable_slot(st, info, key, if_match, now) {
                Ok(slot) => slot,
                Err((e, seen)) => return Outcome::new(Err(e), seen),
            };
            if !st.docs.get(slot).indexed {
                break (state, slot, Vec::new());
            }
            let current = st.docs.terms_ref(slot);
            match old_terms.take() {
                Some((r, t)) if r == current => break (state, slot, t),
                _ if attempt < MAX_OPTIMISTIC_ATTEMPTS => {
                    drop(state);
                    match self.store.get_terms(info.uid, key) {
                        Ok(t) => {
                            old_terms = Some((current, t.map(|t| t.terms).unwrap_or_default()))
                        }
                        Err(e) => return Outcome::failed(e),
                    }
                }
                _ => match self.store.get_terms(info.uid, key) {
                    Ok(t) => break (state, slot, t.map(|t| t.terms).unwrap_or_default()),
                    Err(e) => return Outcome::failed(e),
                },
            }
        };
        let st = &mut *state;
        let change = Change::Remove {
            slot,
            cause: RemoveCause::Deleted,
            terms,
        };
        match st.commit(&*self.store, &[change], &self.metrics, &self.versions) {
            Ok((_, lsn)) => {
                st.client_lsn = lsn;
                Outcome::new(Ok(()), lsn.max(st.collections[&info.uid].settings_lsn))
            }
            Err(e) => Outcome::failed(e),
        }
    }

    /// Reads a live document. Judged under the lock, its body fetched from storage outside
    /// it, and accepted if it is the version judged (else judged again).
    pub(crate) fn read(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        clock: &dyn Clock,
    ) -> Outcome<DocumentView> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (version, now, default_ttl, settle_at) = {
                let mut state = self.lock();
                let st = &mut *state;
                let now = st.now(clock);
                let slot = match live_slot(st, info, key, now) {
                    Ok(slot) => slot,
                    Err((e, seen)) => return Outcome::new(Err(e), seen),
                };
                let meta = st.docs.get(slot);
                let cs = &st.collections[&info.uid];
                if attempt >= MAX_OPTIMISTIC_ATTEMPTS {
                    // Rewritten under every read so far: fetch while holding the lock, once.
                    let record = match self.store.get(info.uid, key) {
                        Ok(Some(record)) => record,
                        Ok(None) => return Outcome::failed(missing_record(key)),
                        Err(e) => return Outcome::failed(e),
                    };
                    let view = view(&record, cs.rules.default_ttl, now);
                    return Outcome::new(Ok(view), meta.lsn.max(cs.settings_lsn));
                }
                (
                    meta.version,
                    now,
                    cs.rules.default_ttl,
                    meta.lsn.max(cs.settings_lsn),
                )
            };
            match self.store.get(info.uid, key) {
                Ok(Some(record)) if record.version == version => {
                    return Outcome::new(Ok(view(&record, default_ttl, now)), settle_at);
                }
                // Rewritten, deleted or purged since it was judged: judge it again.
                Ok(_) => {}
                Err(e) => return Outcome::failed(e),
            }
        }
    }
}

/// Whether terms computed under `used` are the terms under `current`.
pub(super) fn same_policy(
    current: Option<&Arc<IndexPaths>>,
    used: Option<&Arc<IndexPaths>>,
) -> bool {
    match (current, used) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (None, None) => true,
        _ => false,
    }
}

/// Attempts at an optimistic read (judge under the lock, fetch outside it) before one fetch is
/// made under the lock: only a document rewritten during every attempt gets there.
pub(super) const MAX_OPTIMISTIC_ATTEMPTS: usize = 4;

/// The position an answer about what a collection's part of this shard holds (absent, a
/// conflict, a stale etag) must wait for: it may reflect a client write or the rules, not yet
/// durable.
pub(in crate::engine) fn observed(st: &ShardState, cs: &CollectionShard) -> Lsn {
    st.client_lsn.max(cs.settings_lsn)
}

/// The slot of the live document at `key` if `if_match` names its version; else the refusal,
/// with the position it must wait for (touch and delete start here).
fn writable_slot(
    st: &ShardState,
    info: &CollectionInfo,
    key: &DocKey,
    if_match: Option<&str>,
    now: Millis,
) -> Result<u32, (Error, Lsn)> {
    let slot = live_slot(st, info, key, now)?;
    check_if_match(if_match, Some(st.docs.get(slot)), key)
        .map_err(|e| (e, observed(st, &st.collections[&info.uid])))?;
    Ok(slot)
}

/// The slot of the live document at `key`; or NOT_FOUND (or the collection gone) with the
/// position a client told so must wait for.
pub(in crate::engine) fn live_slot(
    st: &ShardState,
    info: &CollectionInfo,
    key: &DocKey,
    now: Millis,
) -> Result<u32, (Error, Lsn)> {
    let Some(cs) = st.collections.get(&info.uid) else {
        return Err((collection_gone(info), Lsn::ZERO));
    };
    cs.index
        .get(key)
        .copied()
        .filter(|&s| st.docs.get(s).is_visible(&cs.rules, now))
        .ok_or_else(|| {
            let e = Error::DocumentNotFound {
                id: key.id.to_string(),
                partition_key: key.partition_key.clone(),
            };
            (e, observed(st, cs))
        })
}

fn check_if_match(
    if_match: Option<&str>,
    live: Option<&DocMeta>,
    key: &DocKey,
) -> Result<(), Error> {
    match if_match {
        None => Ok(()),
        Some(etag) if live.is_some_and(|m| Etag(m.version).matches(etag)) => Ok(()),
        Some(etag) => Err(Error::PreconditionFailed {
            id: key.id.to_string(),
            if_match: etag.to_owned(),
        }),
    }
}

/// The collection was deleted between the catalog lookup and taking the shard lock.
pub(in crate::engine) fn collection_gone(info: &CollectionInfo) -> Error {
    Error::CollectionNotFound {
        database: info.database.to_string(),
        collection: info.id.to_string(),
    }
}

fn missing_record(key: &DocKey) -> Error {
    Error::Storage(StorageError::new(format!(
        "the index has document '{}' in partition {} but storage does not",
        key.id, key.partition_key
    )))
}

pub(in crate::engine) fn view(
    record: &StoredDocument,
    default_ttl: DefaultTtl,
    now: Millis,
) -> DocumentView {
    DocumentView {
        key: record.key.clone(),
        body: record.body.clone(),
        last_write: record.last_write,
        etag: Etag(record.version),
        ttl: record.ttl,
        expires_at: ttl::expires_at(record.last_write, record.ttl, default_ttl),
        read_at: now,
    }
}
