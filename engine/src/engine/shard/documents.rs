//! Document requests on one shard: put, touch, patch, delete and read. The writes are each
//! one optimistic commit (see [`super::optimistic`]): what they read is read outside the shard
//! lock, and they check and write under it.

use super::optimistic::{Fallback, Keyed, Look, OPTIMISTIC_ATTEMPTS, Optimistic, Ready, Stop};
#[allow(clippy::wildcard_imports, reason = "the shard module's vocabulary")]
use super::*;
use crate::engine::{
    DocumentBody, Engine, PatchOp, PatchOptions, condition::PatchCondition, idempotency::Answered,
    index::terms::bounded_document_terms, patch, request_charge::RequestCharge,
};
use serde_json::{Map, Value};

impl Shard {
    /// Creates, upserts or replaces a document. `terms` are its index terms under the policy
    /// given with them, if computed. If the version it replaces has index entries, their terms
    /// are read outside the lock first (see [`Shard::commit_optimistic`]). In a `lazy`
    /// collection neither is needed: the background indexer updates the entries.
    #[allow(
        clippy::too_many_arguments,
        reason = "one argument per part of a write request"
    )]
    pub(crate) fn put(
        &self,
        info: &CollectionInfo,
        key: DocKey,
        (body, map, ttl): (Bytes, &Map<String, Value>, Option<DocumentTtl>),
        (policy, terms): (Option<Arc<IndexPaths>>, Option<Vec<Term>>),
        mode: WriteMode,
        if_match: Option<&str>,
        (version, keyed): (u64, Option<Keyed<'_>>),
        clock: &dyn Clock,
    ) -> Outcome<Answered<(DocumentView, bool)>> {
        let put = Put {
            info,
            key,
            body,
            map,
            ttl,
            policy,
            terms,
            mode,
            if_match,
            version,
        };
        self.commit_optimistic(put, Fallback::UnderLock, clock, keyed)
    }

    /// Stores a new version of a document through the commit path, then views it as of its
    /// write: the common end of put, touch and patch.
    fn write_version(
        &self,
        mut state: MutexGuard<'_, ShardState>,
        slot: Option<u32>,
        (record, index): (StoredDocument, IndexChange),
        remember: Option<Change>,
        patch: bool,
    ) -> Outcome<DocumentView> {
        let owed = matches!(index, IndexChange::Owed);
        let st = &mut *state;
        let record = Arc::new(record);
        let mut changes = vec![Change::Put {
            slot,
            record: record.clone(),
            index,
            patch,
        }];
        let charge = changes[0].charge();
        changes.extend(remember);
        let (deadline, lsn) = match st.commit(&*self.store, &changes, &self.metrics, &self.versions)
        {
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
        Outcome::new(Ok(view), settle_at).charged(charge)
    }

    /// Rewrites a live document with its current body: a write that restarts its TTL clock.
    /// The body is read outside the lock, and written if the document is still that version.
    pub(crate) fn touch(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        if_match: Option<&str>,
        (version, keyed): (u64, Option<Keyed<'_>>),
        clock: &dyn Clock,
    ) -> Outcome<Answered<DocumentView>> {
        let touch = Touch {
            at: Target::new(info, key, if_match),
            version,
        };
        self.commit_optimistic(touch, Fallback::UnderLock, clock, keyed)
    }

    /// Applies `ops` to a live document as one write. The body is read and patched outside
    /// the lock, and written if the document is still the version patched; else the patch is
    /// applied again to the version now there, so concurrent patches all count. With a
    /// `create_if_missing` body and no live document, the body is patched instead and written
    /// as a new document if there is still none (else the live one is patched): the flag
    /// answered says it was created.
    pub(crate) fn patch(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        (ops, condition, options): (&[PatchOp], Option<&PatchCondition>, &PatchOptions),
        if_match: Option<&str>,
        clock: &dyn Clock,
        keyed: Option<Keyed<'_>>,
    ) -> Outcome<Answered<(DocumentView, bool)>> {
        let patch = Patch {
            at: Target::new(info, key, if_match),
            ops,
            condition,
            options,
        };
        self.commit_optimistic(patch, Fallback::UnderLock, clock, keyed)
    }

    /// Deletes a live document, with its index entries (their terms read outside the lock
    /// first, as for a put).
    pub(crate) fn delete(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        if_match: Option<&str>,
        clock: &dyn Clock,
        keyed: Option<Keyed<'_>>,
    ) -> Outcome<Answered<()>> {
        let at = Target::new(info, key, if_match);
        self.commit_optimistic(Delete { at }, Fallback::UnderLock, clock, keyed)
    }

    /// The stored version `version` of a document; stale if storage holds another, or none.
    pub(super) fn stored_version(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        version: u64,
    ) -> Result<Arc<StoredDocument>, Stop> {
        match self.store.get(info.uid, key)? {
            Some(record) if record.version == version => Ok(record),
            _ => Err(Stop::Stale),
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
        let outcome = self.judged_read(info, key, clock).within(self.set);
        let charge = match &outcome.result {
            Ok(view) => RequestCharge::point_read(view.body.len()),
            Err(_) => RequestCharge::LOOKUP,
        };
        outcome.charged(charge)
    }

    fn judged_read(
        &self,
        info: &CollectionInfo,
        key: &DocKey,
        clock: &dyn Clock,
    ) -> Outcome<DocumentView> {
        let mut reads = 0;
        loop {
            let (version, now, default_ttl, settle_at) = {
                let mut state = self.lock();
                let st = &mut *state;
                if let Some(refused) = self.not_serving(st) {
                    return Outcome::failed(refused);
                }
                let now = st.now(clock);
                let slot = match live_slot(st, info, key, now) {
                    Ok(slot) => slot,
                    Err((e, seen)) => return Outcome::new(Err(e), seen),
                };
                let meta = st.docs.get(slot);
                let cs = &st.collections[&info.uid];
                if reads == OPTIMISTIC_ATTEMPTS {
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
            reads += 1;
            match self.stored_version(info, key, version) {
                Ok(record) => return Outcome::new(Ok(view(&record, default_ttl, now)), settle_at),
                // Rewritten, deleted or purged since it was judged: judge it again.
                Err(Stop::Stale) => {}
                Err(Stop::Failed(e)) => return Outcome::failed(e),
            }
        }
    }
}

/// A put (create, upsert, replace) as an optimistic write: it reads the old version's terms.
struct Put<'a> {
    info: &'a CollectionInfo,
    key: DocKey,
    body: Bytes,
    map: &'a Map<String, Value>,
    ttl: Option<DocumentTtl>,
    /// The policy `terms` were computed under, outside the lock.
    policy: Option<Arc<IndexPaths>>,
    terms: Option<Vec<Term>>,
    mode: WriteMode,
    if_match: Option<&'a str>,
    version: u64,
}

/// Where a put writes: the previous version's slot, live or expired, and whether it creates.
struct PutSeen {
    slot: Option<u32>,
    created: bool,
}

impl Optimistic for Put<'_> {
    type Seen = PutSeen;
    type Basis = TermsRef;
    /// The old version's terms.
    type Read = Vec<Term>;
    type Output = (DocumentView, bool);

    fn look(&self, st: &ShardState, now: Millis) -> Result<Look<Self>, (Error, Lsn)> {
        let Some(cs) = st.collections.get(&self.info.uid) else {
            return Err((collection_gone(self.info), Lsn::ZERO));
        };
        // A refusal reflects what this shard holds: it settles like a read of it.
        let seen = observed(st, cs);
        let key = &self.key;
        let slot = cs.index.get(key).copied();
        let live = slot.filter(|&s| st.docs.get(s).is_visible(&cs.rules, now));
        match (self.mode, live) {
            (WriteMode::Create, Some(_)) => {
                let (id, partition_key) = (key.id.to_string(), key.partition_key.clone());
                return Err((Error::DocumentExists { id, partition_key }, seen));
            }
            (WriteMode::Replace, None) => return Err((not_found(key), seen)),
            _ => {}
        }
        check_if_match(self.if_match, live.map(|s| st.docs.get(s)), key).map_err(|e| (e, seen))?;
        must_live(cs, self.info, self.map, self.ttl).map_err(|e| (e, seen))?;
        let found = PutSeen {
            slot,
            created: live.is_none(),
        };
        Ok(match slot {
            Some(s) if st.docs.get(s).indexed && !owes_entries(cs) => {
                Look::Read(found, st.docs.terms_ref(s))
            }
            _ => Look::Commit(found, Vec::new()),
        })
    }

    fn read(&self, shard: &Shard, _: &PutSeen) -> Result<Vec<Term>, Stop> {
        shard.stored_terms(self.info, &self.key)
    }

    fn commit(self, shard: &Shard, ready: Ready<'_, Self>) -> Outcome<(DocumentView, bool)> {
        let Ready {
            state,
            seen,
            read: old,
            now,
            remember,
        } = ready;
        let cs = &state.collections[&self.info.uid];
        let index = match entries_change(cs, self.map, (&self.policy, self.terms), old) {
            Ok(index) => index,
            Err(e) => return Outcome::new(Err(e), observed(&state, cs)),
        };
        let record = StoredDocument {
            collection: self.info.uid,
            key: self.key,
            body: self.body,
            last_write: now,
            version: self.version,
            ttl: self.ttl,
        };
        shard
            .write_version(state, seen.slot, (record, index), remember, false)
            .map(|view| (view, seen.created))
    }
}

/// The live document a touch, patch or delete is of, and the version it must be, if any.
#[derive(Clone, Copy)]
struct Target<'a> {
    info: &'a CollectionInfo,
    key: &'a DocKey,
    if_match: Option<&'a str>,
}

impl<'a> Target<'a> {
    fn new(info: &'a CollectionInfo, key: &'a DocKey, if_match: Option<&'a str>) -> Self {
        Target {
            info,
            key,
            if_match,
        }
    }

    /// Its slot, if it is live and `if_match` names its version; else the refusal.
    fn slot(&self, st: &ShardState, now: Millis) -> Result<u32, (Error, Lsn)> {
        writable_slot(st, self.info, self.key, self.if_match, now)
    }
}

/// A touch as an optimistic write: it reads the current body.
struct Touch<'a> {
    at: Target<'a>,
    version: u64,
}

/// The live document a write found: its slot and version.
struct Found {
    slot: u32,
    version: u64,
}

impl Optimistic for Touch<'_> {
    type Seen = Found;
    /// The version the body is read of.
    type Basis = u64;
    type Read = Arc<StoredDocument>;
    type Output = DocumentView;

    fn look(&self, st: &ShardState, now: Millis) -> Result<Look<Self>, (Error, Lsn)> {
        let slot = self.at.slot(st, now)?;
        let version = st.docs.get(slot).version;
        Ok(Look::Read(Found { slot, version }, version))
    }

    fn read(&self, shard: &Shard, seen: &Found) -> Result<Arc<StoredDocument>, Stop> {
        shard.stored_version(self.at.info, self.at.key, seen.version)
    }

    fn commit(self, shard: &Shard, ready: Ready<'_, Self>) -> Outcome<DocumentView> {
        let (current, now) = (ready.read, ready.now);
        let record = StoredDocument {
            collection: self.at.info.uid,
            key: self.at.key.clone(),
            body: current.body.clone(),
            last_write: now,
            version: self.version,
            ttl: current.ttl,
        };
        // The same body: its index entries stay as they are.
        let slot = Some(ready.seen.slot);
        let write = (record, IndexChange::Unchanged);
        shard.write_version(ready.state, slot, write, ready.remember, false)
    }
}

/// A patch as an optimistic write: it reads the current body (and terms) and patches it; or,
/// creating, patches its `create_if_missing` body (and reads the terms of the expired version
/// it replaces, if any).
struct Patch<'a> {
    at: Target<'a>,
    ops: &'a [PatchOp],
    condition: Option<&'a PatchCondition>,
    options: &'a PatchOptions,
}

/// What a patch's look found.
struct PatchSeen {
    /// The slot written: the live version's, or, creating, the expired version's (if any).
    slot: Option<u32>,
    /// The live version patched; `None`: the document is created from `create_if_missing`.
    version: Option<u64>,
    /// The old version's terms are needed (it has entries, and the collection is not lazy).
    old_terms: bool,
    policy: Option<Arc<IndexPaths>>,
    default_ttl: DefaultTtl,
    now: Millis,
    /// Where the version found settles: what a refusal based on it reflects.
    settle_at: Lsn,
}

/// A patched body, ready to write.
struct Patched {
    body: Bytes,
    ttl: Option<DocumentTtl>,
    map: Arc<Map<String, Value>>,
    /// Its terms, under `policy`.
    terms: Vec<Term>,
    policy: Option<Arc<IndexPaths>>,
    /// The terms of the version patched, if needed.
    old: Vec<Term>,
}

impl Optimistic for Patch<'_> {
    type Seen = PatchSeen;
    /// The slot written (with its stored terms), whether its terms are read, and whether the
    /// patch creates: a document that expired since the reads is created, not patched, and
    /// one created since is patched, not created again (its slot changed).
    type Basis = (Option<TermsRef>, bool, bool);
    type Read = Patched;
    /// The document written, and whether the patch created it.
    type Output = (DocumentView, bool);

    fn look(&self, st: &ShardState, now: Millis) -> Result<Look<Self>, (Error, Lsn)> {
        let found = match self.at.slot(st, now) {
            Ok(slot) => Ok(slot),
            // Absent, deleted or expired, with an initial body (never with an `if_match`: the
            // engine refuses the pair): created, over the expired version if any. A refusal
            // then reflects that the document was not there.
            Err((Error::DocumentNotFound { .. }, settle_at))
                if self.options.create_if_missing.is_some() =>
            {
                Err(settle_at)
            }
            Err(refused) => return Err(refused),
        };
        let cs = &st.collections[&self.at.info.uid];
        let (slot, version, settle_at) = match found {
            Ok(slot) => {
                let meta = st.docs.get(slot);
                (
                    Some(slot),
                    Some(meta.version),
                    meta.lsn.max(cs.settings_lsn),
                )
            }
            Err(settle_at) => (cs.index.get(self.at.key).copied(), None, settle_at),
        };
        let old_terms = slot.is_some_and(|s| st.docs.get(s).indexed) && !owes_entries(cs);
        let seen = PatchSeen {
            slot,
            version,
            old_terms,
            policy: cs.policy.clone(),
            default_ttl: cs.rules.default_ttl,
            now,
            settle_at,
        };
        let basis = (
            slot.map(|s| st.docs.terms_ref(s)),
            old_terms,
            version.is_none(),
        );
        Ok(Look::Read(seen, basis))
    }

    fn read(&self, shard: &Shard, seen: &PatchSeen) -> Result<Patched, Stop> {
        let mut map = match (seen.version, &self.options.create_if_missing) {
            (Some(version), _) => {
                let record = shard.stored_version(self.at.info, self.at.key, version)?;
                let current = view(&record, seen.default_ttl, seen.now);
                if let Some(condition) = self.condition {
                    condition.check(&current)?;
                }
                current.body_map()
            }
            // Created: the caller's body is not checked against the condition.
            (None, Some(initial)) => (**initial.map()).clone(),
            (None, None) => unreachable!("only a patch with an initial body creates"),
        };
        patch::apply(&mut map, self.ops, self.options.create_parents).map_err(Error::from)?;
        let body = DocumentBody::parse(Arc::new(map), None).map_err(Error::from)?;
        // The partition key may not change: the document would move to another partition.
        Engine::key_for(self.at.info, &body, Some(self.at.key.partition_key.clone()))
            .map_err(Error::from)?;
        // Bounded in a `lazy` collection too, as every write is.
        let terms = match &seen.policy {
            Some(p) => bounded_document_terms(body.map(), p).map_err(Error::from)?,
            None => Vec::new(),
        };
        let old = match seen.old_terms {
            true => shard.stored_terms(self.at.info, self.at.key)?,
            false => Vec::new(),
        };
        let map = body.map().clone();
        let (body, ttl) = body.into_stored();
        Ok(Patched {
            body,
            ttl,
            map,
            terms,
            policy: seen.policy.clone(),
            old,
        })
    }

    fn reflects(seen: &PatchSeen) -> Lsn {
        seen.settle_at
    }

    fn commit(self, shard: &Shard, ready: Ready<'_, Self>) -> Outcome<(DocumentView, bool)> {
        let Ready {
            state,
            seen,
            read: patched,
            now,
            remember,
        } = ready;
        let cs = &state.collections[&self.at.info.uid];
        // What the patch left, judged by the rules in force now.
        if let Err(e) = must_live(cs, self.at.info, &patched.map, patched.ttl) {
            return Outcome::new(Err(e), seen.settle_at.max(cs.settings_lsn));
        }
        let terms = (&patched.policy, Some(patched.terms));
        let index = match entries_change(cs, &patched.map, terms, patched.old) {
            Ok(index) => index,
            Err(e) => return Outcome::new(Err(e), seen.settle_at),
        };
        let record = StoredDocument {
            collection: self.at.info.uid,
            key: self.at.key.clone(),
            body: patched.body,
            last_write: now,
            version: shard.versions.fetch_add(1, Ordering::Relaxed),
            ttl: patched.ttl,
        };
        let created = seen.version.is_none();
        shard
            .write_version(state, seen.slot, (record, index), remember, true)
            .map(|view| (view, created))
    }
}

/// A delete as an optimistic write: it reads the terms of what it deletes.
struct Delete<'a> {
    at: Target<'a>,
}

impl Optimistic for Delete<'_> {
    /// The document's slot.
    type Seen = u32;
    type Basis = TermsRef;
    type Read = Vec<Term>;
    type Output = ();

    fn look(&self, st: &ShardState, now: Millis) -> Result<Look<Self>, (Error, Lsn)> {
        let slot = self.at.slot(st, now)?;
        Ok(match st.docs.get(slot).indexed {
            true => Look::Read(slot, st.docs.terms_ref(slot)),
            false => Look::Commit(slot, Vec::new()),
        })
    }

    fn read(&self, shard: &Shard, _: &u32) -> Result<Vec<Term>, Stop> {
        shard.stored_terms(self.at.info, self.at.key)
    }

    fn commit(self, shard: &Shard, mut ready: Ready<'_, Self>) -> Outcome<()> {
        let st = &mut *ready.state;
        let mut changes = vec![Change::Remove {
            slot: ready.seen,
            cause: RemoveCause::Deleted,
            terms: ready.read,
        }];
        let charge = changes[0].charge();
        changes.extend(ready.remember.take());
        match st.commit(&*shard.store, &changes, &shard.metrics, &shard.versions) {
            Ok((_, lsn)) => {
                st.client_lsn = lsn;
                Outcome::new(
                    Ok(()),
                    lsn.max(st.collections[&self.at.info.uid].settings_lsn),
                )
                .charged(charge)
            }
            Err(e) => Outcome::failed(e),
        }
    }
}

/// Whether the collection's writes leave their index entries to the background indexer.
fn owes_entries(cs: &CollectionShard) -> bool {
    cs.lazy && cs.policy.is_some()
}

/// What a new body does to its document's index entries, decided under the lock: nothing
/// yet where the background indexer owes them ([`owes_entries`]); else they go from `old` to
/// the body's terms under the policy in force: `terms` if computed under it (outside the
/// lock), else computed here, once the policy changed in between (rare, and one document).
fn entries_change(
    cs: &CollectionShard,
    map: &Map<String, Value>,
    (policy, terms): (&Option<Arc<IndexPaths>>, Option<Vec<Term>>),
    old: Vec<Term>,
) -> Result<IndexChange, Error> {
    if owes_entries(cs) {
        return Ok(IndexChange::Owed);
    }
    let new = match (terms, &cs.policy) {
        (Some(terms), _) if same_policy(cs.policy.as_ref(), policy.as_ref()) => terms,
        (_, Some(p)) => bounded_document_terms(map, p)?,
        (_, None) => Vec::new(),
    };
    Ok(IndexChange::Replace(old, new))
}

/// Refuses a body that a must-live rule in force on this shard keeps, without `"ttl": -1`.
/// Called under the lock, in the hold that commits the body (see [`CollectionShard::must_live`]).
pub(super) fn must_live(
    cs: &CollectionShard,
    info: &CollectionInfo,
    map: &Map<String, Value>,
    ttl: Option<DocumentTtl>,
) -> Result<(), Error> {
    cs.must_live
        .check(info.id.as_str(), map, ttl)
        .map_err(Error::from)
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
        .ok_or_else(|| (not_found(key), observed(st, cs)))
}

fn not_found(key: &DocKey) -> Error {
    Error::DocumentNotFound {
        id: key.id.to_string(),
        partition_key: key.partition_key.clone(),
    }
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
