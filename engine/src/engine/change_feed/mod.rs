//! The change feed: every change of a collection, in commit order per shard, the expiry of a
//! document at its expiry instant (see `docs/changefeed.md`). Commits append the records (the
//! shard's commit path); this module says what a record is and how the feed is read: from a
//! start or a continuation, durable records only, page by page, waiting when caught up.

mod range;
mod record;
mod retention;
mod token;

use std::time::Duration;

pub use range::{FeedRange, MAX_FEED_RANGES, partition_hash};
pub use record::{ChangeOp, ChangeRecord};
pub use retention::RetentionGuard;

use super::{
    CollectionInfo, CollectionPath, CollectionUid, DefaultTtl, Engine, Error, Millis, Outcome,
    QueryReads,
};
use crate::model::PartitionKeyValue;
use crate::storage::Lsn;

/// Records read from storage per request to it.
const READ_CHUNK: usize = 256;
/// Records a page reads at most, shown or not: a feed of one partition or range skips other
/// partitions' records a bounded number at a time.
const MAX_SCANNED: usize = 4096;
/// Bytes an event takes besides its body, as a response holds it (ids, keys, positions).
const EVENT_OVERHEAD: usize = 256;

/// Which events a feed shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChangeFeedMode {
    /// Creates, replaces and patches: the new versions of changed documents.
    #[default]
    LatestVersion,
    /// Every change: writes, deletes and expiries.
    AllVersionsAndDeletes,
}

/// Which part of a collection's feed is read.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeFeedScope {
    /// All of it.
    Collection,
    /// One partition key value's events.
    Partition(PartitionKeyValue),
    /// A range from [`Engine::feed_ranges`].
    Range(FeedRange),
}

/// Where a feed starts.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeFeedStart {
    /// After every change committed so far.
    Now,
    /// At the oldest event retention keeps.
    Beginning,
    /// At the first event committed at or after this instant (Unix ms), as far as a search of
    /// each shard's log by position finds it (expiry events carry their instant, which may
    /// precede their position's commit by the purge's lag).
    Time(Millis),
    /// Where a continuation token left off.
    Continuation(String),
}

/// One event of a feed.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeEvent {
    /// The shard whose log holds it.
    pub shard: usize,
    /// Its position in that log: later events of a partition have larger positions.
    pub lsn: u64,
    pub record: ChangeRecord,
}

/// Where a feed reader stands: the next position to read in each shard of its scope. Sealed
/// into a continuation token after every page.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeFeedCursor {
    uid: CollectionUid,
    /// When the feed it reads was turned on (see [`crate::model::CollectionSettings::change_feed_since`]).
    since: Millis,
    mode: ChangeFeedMode,
    scope: ChangeFeedScope,
    next: Vec<(usize, u64)>,
    /// Which shard a page starts at, turning, so that a busy shard does not starve the others.
    turn: usize,
}

impl ChangeFeedCursor {
    /// The events it shows.
    pub fn mode(&self) -> ChangeFeedMode {
        self.mode
    }

    /// What part of the feed it reads.
    pub fn scope(&self) -> &ChangeFeedScope {
        &self.scope
    }

    /// The next position to read in each shard it reads, in shard order.
    pub fn positions(&self) -> &[(usize, u64)] {
        &self.next
    }

    /// Moves shard `shard`'s next position to `next` (a cluster node merging the feeds its
    /// partitions' owners serve); a shard it does not read is left alone.
    pub fn advance(&mut self, shard: usize, next: u64) {
        if let Some(at) = self.next.iter_mut().find(|(s, _)| *s == shard) {
            at.1 = next;
        }
    }

    /// Its part in shards `first..=last`, as a feed range of its own (all of those shards'
    /// partitions: a part of a whole-shard scope), for the node serving them to resume.
    /// `None` if it reads none of them.
    pub fn part(&self, first: usize, last: usize) -> Option<ChangeFeedCursor> {
        let next: Vec<(usize, u64)> = self
            .next
            .iter()
            .copied()
            .filter(|(s, _)| (first..=last).contains(s))
            .collect();
        (!next.is_empty()).then(|| ChangeFeedCursor {
            scope: ChangeFeedScope::Range(FeedRange::whole_shards(first, last)),
            next,
            turn: 0,
            ..self.clone()
        })
    }

    /// Whether the feed shows `record` of shard `shard`.
    fn shows(&self, shard: usize, record: &ChangeRecord) -> bool {
        let in_scope = match &self.scope {
            ChangeFeedScope::Collection => true,
            ChangeFeedScope::Partition(pk) => record.key.partition_key == *pk,
            ChangeFeedScope::Range(range) => range.holds(shard, &record.key.partition_key),
        };
        in_scope && (self.mode == ChangeFeedMode::AllVersionsAndDeletes || record.op.is_write())
    }
}

impl Engine {
    /// `n` feed ranges of a collection: each partition key value's events are in exactly one.
    pub fn feed_ranges(&self, path: &CollectionPath, n: usize) -> Result<Vec<FeedRange>, Error> {
        let info = self.get_collection(path)?;
        feed_on(&info, path)?;
        Ok(FeedRange::split(self.shard_count(), n)?)
    }

    /// Parses a feed range a client sent back.
    pub fn parse_feed_range(&self, text: &str) -> Result<FeedRange, Error> {
        Ok(FeedRange::parse(text, self.shard_count())?)
    }

    /// Where a feed of a collection starts. With a continuation, `scope` and `mode` may be
    /// left out (the token's are used) or must be the token's.
    pub fn open_change_feed(
        &self,
        path: &CollectionPath,
        scope: Option<ChangeFeedScope>,
        mode: Option<ChangeFeedMode>,
        start: ChangeFeedStart,
    ) -> Result<ChangeFeedCursor, Error> {
        let info = self.get_collection(path)?;
        feed_on(&info, path)?;
        if let ChangeFeedStart::Continuation(token) = &start {
            let cursor = self.resumed_change_feed(&info, scope.as_ref(), mode, token)?;
            self.check_retained(&cursor)?;
            return Ok(cursor);
        }
        let scope = scope.unwrap_or(ChangeFeedScope::Collection);
        let shards: Vec<usize> = match &scope {
            ChangeFeedScope::Collection => (0..self.shard_count()).collect(),
            ChangeFeedScope::Partition(pk) => vec![self.shard_index(&info, pk)],
            ChangeFeedScope::Range(range) => range.shards().collect(),
        };
        let mut next = Vec::with_capacity(shards.len());
        for shard in shards {
            let from = match start {
                ChangeFeedStart::Now => self.inner.shards[shard].log_tip().seq + 1,
                ChangeFeedStart::Beginning => self.inner.shards[shard].log_floor(info.uid)?.max(1),
                ChangeFeedStart::Time(at) => self.first_at_or_after(info.uid, shard, at)?,
                ChangeFeedStart::Continuation(_) => unreachable!("opened above"),
            };
            next.push((shard, from));
        }
        Ok(ChangeFeedCursor {
            uid: info.uid,
            since: info.settings.change_feed_since(),
            mode: mode.unwrap_or_default(),
            scope,
            next,
            turn: 0,
        })
    }

    /// The cursor a continuation token of `path`'s feed holds, checked as
    /// [`Engine::open_change_feed`] checks it but for retention, which only the nodes serving
    /// its shards can check (a cluster node that will ask them).
    pub fn change_feed_cursor(
        &self,
        path: &CollectionPath,
        scope: Option<&ChangeFeedScope>,
        mode: Option<ChangeFeedMode>,
        token: &str,
    ) -> Result<ChangeFeedCursor, Error> {
        let info = self.get_collection(path)?;
        feed_on(&info, path)?;
        self.resumed_change_feed(&info, scope, mode, token)
    }

    fn resumed_change_feed(
        &self,
        info: &CollectionInfo,
        scope: Option<&ChangeFeedScope>,
        mode: Option<ChangeFeedMode>,
        token: &str,
    ) -> Result<ChangeFeedCursor, Error> {
        let cursor = self.open_change_feed_token(token)?;
        if cursor.uid != info.uid {
            return Err(crate::model::InvalidInput::Continuation {
                reason: "it belongs to another collection",
            }
            .into());
        }
        check_since(info, &cursor)?;
        if scope.is_some_and(|s| *s != cursor.scope) || mode.is_some_and(|m| m != cursor.mode) {
            return Err(crate::model::InvalidInput::Continuation {
                reason: "it was issued for another partition, feed range or mode; leave those out to resume it, or send the ones it was issued for",
            }
            .into());
        }
        Ok(cursor)
    }

    /// The cursor a continuation token holds, if this server sealed it: its scope is what a
    /// caller resuming it must be allowed to read. Reads nothing but the token.
    pub fn open_change_feed_token(&self, token: &str) -> Result<ChangeFeedCursor, Error> {
        let bytes = self.inner.token_key.open(token)?;
        Ok(token::decode(&bytes, self.shard_count())?)
    }

    /// The continuation token that resumes `cursor`.
    pub fn change_feed_token(&self, cursor: &ChangeFeedCursor) -> String {
        self.inner
            .token_key
            .seal(&token::encode(cursor, self.shard_count()))
    }

    /// The first position in a shard's log, among what retention kept, whose record of `uid`
    /// was appended at or after `at`: a binary search over positions by the time each record
    /// was appended (which never decreases along a log), a record read per step.
    fn first_at_or_after(
        &self,
        uid: CollectionUid,
        shard: usize,
        at: Millis,
    ) -> Result<u64, Error> {
        let s = &self.inner.shards[shard];
        let (mut low, mut high) = (s.log_floor(uid)?.max(1), s.log_tip().seq + 1);
        while low < high {
            let mid = low + (high - low) / 2;
            match s.read_log(uid, mid, 1)?.first() {
                Some((seq, record)) if ChangeRecord::decode_log(record)?.logged_at < at => {
                    low = seq + 1;
                }
                _ => high = mid,
            }
        }
        Ok(low)
    }

    /// Refuses a cursor that points below what retention kept: resuming it would skip events.
    fn check_retained(&self, cursor: &ChangeFeedCursor) -> Result<(), Error> {
        for &(shard, next) in &cursor.next {
            self.check_shard_retained(cursor.uid, shard, next)?;
        }
        Ok(())
    }

    fn check_shard_retained(
        &self,
        uid: CollectionUid,
        shard: usize,
        next: u64,
    ) -> Result<(), Error> {
        let s = &self.inner.shards[shard];
        let floor = s.log_floor(uid)?;
        if next >= floor {
            return Ok(());
        }
        let oldest = s.read_log(uid, floor, 1)?.into_iter().next();
        let at = match &oldest {
            Some((_, record)) => Some(ChangeRecord::decode_log(record)?.crts),
            None => None,
        };
        Err(Error::ChangesTrimmed {
            shard,
            oldest: oldest.map_or(floor, |(seq, _)| seq),
            at,
        })
    }

    /// Waits, at most `wait`, until the feed may have durable events past `cursor`: records
    /// appended in a shard it reads, now durable. Returns at once if there are; `false` if the
    /// wait ran out. Fails if the collection is gone.
    pub async fn wait_for_changes(
        &self,
        cursor: &ChangeFeedCursor,
        wait: Duration,
    ) -> Result<bool, Error> {
        let deadline = tokio::time::Instant::now() + wait;
        let first = cursor.next.first().map_or(0, |&(s, _)| s);
        // Subscribed before looking, so that no append between the look and the wait is missed.
        let Some(mut signal) = self.inner.shards[first].feed_signal(cursor.uid) else {
            return Err(Error::Cancelled);
        };
        loop {
            let mut ready = false;
            for &(shard, next) in &cursor.next {
                let s = &self.inner.shards[shard];
                let tip = s.collection_tip(cursor.uid);
                if tip.seq >= next {
                    if tip.seq > s.durable_log_seq() {
                        s.make_log_durable(tip).await.map_err(Error::NotDurable)?;
                    }
                    ready = true;
                }
            }
            if ready {
                return Ok(true);
            }
            // A look without a wait needs no timer (nor a runtime to drive one).
            if wait.is_zero() {
                return Ok(false);
            }
            match tokio::time::timeout_at(deadline, signal.changed()).await {
                Ok(Ok(())) => {}
                // The collection's shards let go of the signal: it was deleted.
                Ok(Err(_)) => return Err(Error::Cancelled),
                Err(_) => return Ok(false),
            }
        }
    }

    /// The durable events past `cursor`, at most `max_events` and about `max_bytes` of bodies
    /// (one at least), moving `cursor` past them. Empty when none of the durable records is
    /// the feed's (other partitions', or deletes in `latest_version` mode): the cursor still
    /// moves. Each record read counts against `reads`, and the bodies kept are reserved in
    /// its memory first. Blocks on storage unless `reads` is inline.
    pub fn read_changes(
        &self,
        cursor: &mut ChangeFeedCursor,
        max_events: usize,
        max_bytes: usize,
        reads: &mut QueryReads,
    ) -> Result<Vec<ChangeEvent>, Error> {
        let max_events = max_events.max(1);
        let mut page = Page {
            events: Vec::new(),
            bytes: 0,
            scanned: 0,
        };
        let shards = cursor.next.len();
        for k in 0..shards {
            let i = (cursor.turn + k) % shards;
            let (shard, from) = cursor.next[i];
            let (next, ended) = self.read_shard(
                cursor,
                shard,
                from,
                &mut page,
                (max_events, max_bytes),
                reads,
            )?;
            // Retention may have removed records while they were read: checked after, so that
            // no page hides a gap.
            self.check_shard_retained(cursor.uid, shard, from)?;
            cursor.next[i].1 = next;
            if ended {
                cursor.turn = (i + 1) % shards;
                break;
            }
        }
        Ok(page.events)
    }

    /// Reads one shard's part of a page from position `from` into `page`; returns where the
    /// shard's next read starts, and whether the page is done (full, or out of budget).
    fn read_shard(
        &self,
        cursor: &ChangeFeedCursor,
        shard: usize,
        from: u64,
        page: &mut Page,
        (max_events, max_bytes): (usize, usize),
        reads: &mut QueryReads,
    ) -> Result<(u64, bool), Error> {
        let s = &self.inner.shards[shard];
        // A partition this node does not serve (cluster mode) holds none of its changes.
        s.check_serving()?;
        let durable = s.durable_log_seq();
        let mut next = from;
        while next <= durable {
            // Records of other partitions (a filtered feed) cost a read each: a page stops
            // after so many, returning what it has and where it got to.
            if page.scanned >= MAX_SCANNED {
                return Ok((next, true));
            }
            let want = READ_CHUNK.min(max_events - page.events.len());
            reads.spend(want)?;
            let records = s.read_log(cursor.uid, next, want)?;
            page.scanned += records.len();
            let exhausted = records.len() < want;
            for (seq, raw) in records {
                if seq > durable {
                    // The rest is not durable yet: this shard is read up to its end.
                    return Ok((durable + 1, false));
                }
                let record = ChangeRecord::decode_log(&raw)?;
                if cursor.shows(shard, &record) {
                    let size = record.body.as_ref().map_or(0, |b| b.len());
                    // A page keeps what the response budget has room for: it ends before an
                    // event that does not fit, or fails if that is its first.
                    let held = page.bytes + size + EVENT_OVERHEAD * (page.events.len() + 1);
                    if !reads.hold(held) {
                        if page.events.is_empty() {
                            return Err(Error::NoMemory);
                        }
                        return Ok((next, true));
                    }
                    page.bytes += size;
                    page.events.push(ChangeEvent {
                        shard,
                        lsn: seq,
                        record,
                    });
                    next = seq + 1;
                    if page.events.len() >= max_events || page.bytes >= max_bytes {
                        return Ok((next, true));
                    }
                } else {
                    next = seq + 1;
                }
            }
            if exhausted {
                // Nothing more of this collection up to the durable end.
                next = next.max(durable + 1);
            }
        }
        Ok((next, false))
    }
}

/// What a page has gathered so far.
struct Page {
    events: Vec<ChangeEvent>,
    bytes: usize,
    /// Records read, shown or not.
    scanned: usize,
}

/// One message of a change feed stream.
#[derive(Debug)]
pub struct ChangeFeedPage {
    pub events: Vec<ChangeEvent>,
    /// Where the next page starts.
    pub next: ChangeFeedCursor,
    /// The token that resumes at `next`.
    pub continuation: String,
    /// The collection's default TTL now, to view the events' documents by.
    pub default_ttl: DefaultTtl,
    /// The clock reading the page was made at.
    pub read_at: Millis,
}

impl Engine {
    /// The next page of a change feed from `at` (see [`Engine::read_changes`]), within
    /// `reads` (an inline run that needs more fails with [`Error::ReadBudgetSpent`]).
    pub fn change_feed_page(
        &self,
        path: &CollectionPath,
        at: &ChangeFeedCursor,
        max_events: usize,
        mut reads: QueryReads,
    ) -> Outcome<ChangeFeedPage> {
        let result = self.get_collection(path).and_then(|info| {
            // The feed may have been turned off (and on) since the stream began.
            feed_on(&info, path)?;
            check_since(&info, at)?;
            let mut next = at.clone();
            let events = self.read_changes(&mut next, max_events, self.page_bytes(), &mut reads)?;
            Ok(ChangeFeedPage {
                events,
                continuation: self.change_feed_token(&next),
                next,
                default_ttl: info.settings.default_ttl(),
                read_at: self.inner.clock.now(),
            })
        });
        // Only durable records are read: nothing to wait for before sending.
        Outcome::new(result.map_err(|e| reads.explain(e)), Lsn::ZERO)
    }
}

/// Refuses a cursor from before the feed was last turned on.
fn check_since(info: &CollectionInfo, cursor: &ChangeFeedCursor) -> Result<(), Error> {
    let since = info.settings.change_feed_since();
    if cursor.since == since {
        Ok(())
    } else {
        Err(Error::FeedRestarted { since })
    }
}

/// Refuses a collection that keeps no feed.
fn feed_on(info: &CollectionInfo, path: &CollectionPath) -> Result<(), Error> {
    if info.settings.change_feed_retention().is_on() {
        Ok(())
    } else {
        Err(Error::NoChangeFeed {
            database: path.database.as_str().to_owned(),
            collection: path.collection.as_str().to_owned(),
        })
    }
}
