//! A consumer group: members that share a collection's change feed, each reading the feed
//! ranges it holds a lease on, with checkpoints kept in a Mayfly collection (the pattern of
//! Cosmos DB's change feed processor).
//!
//! Two documents per range, in the leases collection (partition key path `/group`):
//! - `lease-<range number>`: who holds the range, with a TTL of the lease duration. A member
//!   renews it when it checkpoints; one that dies stops renewing, and the lease expires, by
//!   Mayfly's own TTL, at its instant: another member then claims the range.
//! - `checkpoint-<range number>`: the continuation after the last batch handled, never
//!   expiring. A member that claims a range resumes from it, so every event is handled once
//!   across members, crashes included (a batch handled but not yet checkpointed is handled
//!   again: checkpoint after handling, and make handling idempotent).

use std::time::Duration;

use serde_json::{Value, json};

use crate::{
    changes::{ChangeFeed, ChangeStream, FeedRange, StartFrom},
    collection::Collection,
    error::{Error, ErrorDetails},
    ttl::DocumentTtl,
};

/// One member of a consumer group; see the module documentation.
#[derive(Debug, Clone)]
pub struct ConsumerGroup {
    feed: Collection,
    leases: Collection,
    group: String,
    member: String,
    ranges: u32,
    lease: Duration,
    all_versions: bool,
}

/// A range this member holds: read it with [`ConsumerGroup::open`], and record progress
/// with [`ConsumerGroup::checkpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedRange {
    /// Its number in the group's split.
    pub number: u32,
    pub range: FeedRange,
    /// The lease's version: a renewal that finds another fails (the lease was lost).
    etag: String,
}

impl ConsumerGroup {
    /// Member `member` of group `group` reading `feed`, with leases and checkpoints in
    /// `leases` (a collection whose partition key path is `/group`, TTL on). Defaults: as many
    /// ranges as 4, leases of 10 s, the `latest_version` mode.
    pub fn new(feed: &Collection, leases: &Collection, group: &str, member: &str) -> Self {
        ConsumerGroup {
            feed: feed.clone(),
            leases: leases.clone(),
            group: group.to_owned(),
            member: member.to_owned(),
            ranges: 4,
            lease: Duration::from_secs(10),
            all_versions: false,
        }
    }

    /// How many ranges the group splits the feed into (every member must say the same).
    pub fn ranges(mut self, ranges: u32) -> Self {
        self.ranges = ranges;
        self
    }

    /// How long a lease lasts without a checkpoint (whole seconds, at least 1).
    pub fn lease_duration(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Reads every version, deletes and expiries too.
    pub fn all_versions_and_deletes(mut self) -> Self {
        self.all_versions = true;
        self
    }

    fn lease_ttl(&self) -> DocumentTtl {
        DocumentTtl::After(self.lease.max(Duration::from_secs(1)))
    }

    /// Claims every range no live member holds, up to `max`; returns the ranges claimed now.
    pub async fn claim(&self, max: usize) -> Result<Vec<ClaimedRange>, Error> {
        let split = self.feed.feed_ranges(self.ranges).await?;
        let mut claimed = Vec::new();
        for (number, range) in split.into_iter().enumerate() {
            if claimed.len() >= max {
                break;
            }
            let lease = json!({
                "id": format!("lease-{number}"),
                "group": self.group,
                "owner": self.member,
                "range": range.as_str(),
            });
            // Create fails while another member's lease lives: it expires if that member dies.
            match self.leases.create(&lease).ttl(self.lease_ttl()).await {
                Ok(doc) => claimed.push(ClaimedRange {
                    number: number as u32,
                    range,
                    etag: doc.etag().to_owned(),
                }),
                Err(Error::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(claimed)
    }

    /// The range's feed, from its checkpoint (or from the beginning, if none).
    pub async fn open(&self, claimed: &ClaimedRange) -> Result<ChangeStream, Error> {
        let checkpoint = self
            .leases
            .read(
                &format!("checkpoint-{}", claimed.number),
                self.group.as_str(),
            )
            .await?;
        let start = match checkpoint
            .as_ref()
            .and_then(|c| c.body().get("continuation").and_then(Value::as_str))
        {
            Some(token) => StartFrom::Continuation(token.to_owned()),
            None => StartFrom::Beginning,
        };
        let mut feed: ChangeFeed<'_> = self.feed.changes().feed_range(&claimed.range);
        if self.all_versions {
            feed = feed.all_versions_and_deletes();
        }
        feed.start(start).await
    }

    /// Records that everything before `continuation` is handled, renewing the lease first.
    /// Fails as [`ConsumerGroup::renew`] does if the lease was lost; nothing is recorded then.
    pub async fn checkpoint(
        &self,
        claimed: &mut ClaimedRange,
        continuation: &str,
    ) -> Result<(), Error> {
        self.renew(claimed).await?;
        self.leases
            .upsert(&json!({
                "id": format!("checkpoint-{}", claimed.number),
                "group": self.group,
                "continuation": continuation,
            }))
            .ttl(DocumentTtl::Never)
            .await?;
        Ok(())
    }

    /// Renews the lease for another lease duration: call it more often than that while a
    /// range is quiet. Fails with [`Error::PreconditionFailed`] or [`Error::NotFound`] if the
    /// lease was lost (it expired, and another member may hold the range): stop reading the
    /// range then.
    pub async fn renew(&self, claimed: &mut ClaimedRange) -> Result<(), Error> {
        let lease = json!({
            "id": format!("lease-{}", claimed.number),
            "group": self.group,
            "owner": self.member,
            "range": claimed.range.as_str(),
        });
        let renewed = self
            .leases
            .replace(&format!("lease-{}", claimed.number), self.group.as_str(), &lease)
            .if_match(&claimed.etag)
            .ttl(self.lease_ttl())
            .await?
            .into_document()
            .ok_or_else(|| {
                Error::NotFound(ErrorDetails::new(
                    tonic::Code::NotFound,
                    format!(
                        "the lease on range {} of group {:?} expired before this checkpoint: another member may hold it now",
                        claimed.number, self.group
                    ),
                    None,
                ))
            })?;
        claimed.etag = renewed.etag().to_owned();
        Ok(())
    }
}
