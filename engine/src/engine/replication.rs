//! What cluster mode asks of the engine (docs/cluster.md): a shard that follows an owner
//! elsewhere applies the owner's commits from the partition's log, and serves once promoted.
//! The engine knows nothing of NATS: the cluster crate reads the log and calls these.

use super::{
    Engine, Millis,
    error::Error,
    shard::{ReplicatedCommit, ShardSnapshot},
};
use crate::storage::Lsn;

impl Engine {
    /// Makes shard `shard` follow an owner elsewhere (its purge stops, nothing is decided by
    /// its clock), or, with `false`, promotes it to owner.
    pub fn set_following(&self, shard: usize, following: bool) {
        self.inner.shards[shard].set_following(following);
    }

    /// Applies an owner's commit to shard `shard` (which should be following); returns where
    /// local storage applied it (durable once storage says so). Refuses, changing nothing, a
    /// commit that does not continue the shard's log or does not fit its documents. Records of
    /// a collection deleted since (its uid was handed out here, and it is gone) are passed
    /// over: their positions are taken, nothing is applied.
    pub fn apply_replicated(
        &self,
        shard: usize,
        commit: ReplicatedCommit<'_>,
    ) -> Result<Lsn, Error> {
        let handed_out = self.inner.catalog.read().last_uid();
        self.inner.shards[shard].apply_replicated(commit, handed_out)
    }

    /// Bounds what shard `shard` serves by its partition lease: every request from reading
    /// `until` of the lease clock ([`super::EngineConfig::lease_clock`]) on is refused
    /// `NOT_OWNER`, until a renewal moves it. Checked under the shard lock in the hold that
    /// answers, so an owner paused past its lease answers nothing when it wakes.
    /// `time_cap`: the largest wall clock reading the lease lets the shard act on (see
    /// docs/cluster.md, "Expiry across owners"): its time holds there rather than pass it.
    pub fn serve_until(&self, shard: usize, until: u64, time_cap: Millis) {
        self.inner.shards[shard].serve_until(until, time_cap);
    }

    /// Moves shard `shard`'s time forward to at least `floor`: a follower raises it to each
    /// logged commit's watermark, and a new owner to its predecessor's last `lease_until`,
    /// before it serves, so that nothing an earlier owner may have reported expired is alive
    /// here, whatever this node's clock says.
    pub fn raise_time(&self, shard: usize, floor: Millis) {
        self.inner.shards[shard].raise_time(floor);
    }

    /// Shard `shard`'s time now: the engine's clock, never behind a time the shard acted on
    /// or was raised to, nor past its cap.
    pub fn shard_time(&self, shard: usize) -> Millis {
        self.inner.shards[shard].reading(&*self.inner.clock)
    }

    /// Whether shard `shard` serves clients now (not following, its lease, if any, running).
    pub fn serves(&self, shard: usize) -> bool {
        self.inner.shards[shard].check_serving().is_ok()
    }

    /// How documents are placed over the shards.
    pub fn placement(&self) -> super::Placement {
        self.inner.placement
    }

    /// Marks shard `shard`'s partition log as diverged (`Some`: why): it answers every request
    /// [`Error::LogDiverged`] until the mark is cleared (`None`).
    pub fn set_diverged(&self, shard: usize, why: Option<&str>) {
        self.inner.shards[shard].set_diverged(why);
    }

    /// Whether shard `shard`'s diverged log may be being re-based by its owner: requests are
    /// answered [`Error::LogRepairing`] (retryable) rather than [`Error::LogDiverged`]. A
    /// newly marked shard is taken to be repairing until this says otherwise.
    pub fn set_log_repairing(&self, shard: usize, repairing: bool) {
        self.inner.shards[shard].set_repairing(repairing);
    }

    /// Why shard `shard`'s partition log is marked diverged, if it is.
    pub fn diverged(&self, shard: usize) -> Option<String> {
        self.inner.shards[shard].diverged().map(|w| w.to_string())
    }

    /// Moves following shard `shard`'s log end forward to `seq`: positions an owner's commits
    /// took with nothing for this copy to keep (records of a collection deleted since), which
    /// its storage does not record, known from where the node stood in the log before it
    /// restarted. Never backwards.
    pub fn pass_log_to(&self, shard: usize, seq: u64) {
        self.inner.shards[shard].pass_log_to(seq);
    }

    /// A value the node keeps beside its documents (see [`crate::storage::Storage::node_state`]).
    pub fn node_state(&self, key: &str) -> Result<Option<bytes::Bytes>, Error> {
        self.inner.storage.node_state(key).map_err(Error::Storage)
    }

    /// Writes a value the node keeps beside its documents, after every write made before
    /// (see [`crate::storage::Storage::put_node_state`]).
    pub fn put_node_state(&self, key: &str, value: &[u8]) -> Result<(), Error> {
        self.inner
            .storage
            .put_node_state(key, value)
            .map_err(Error::Storage)
    }

    /// Resolves once every write applied so far is durable, as far as shard `shard`'s results
    /// go: a follower's copy, and the state it keeps of it, before it says it applied them.
    pub async fn flush_shard(&self, shard: usize) -> Result<(), Error> {
        self.durable_at(
            self.inner.storage.last_applied(),
            crate::storage::ShardSet::one(shard),
        )
        .await
    }

    /// The last change log position of shard `shard` (0: none).
    pub fn log_end(&self, shard: usize) -> u64 {
        self.inner.shards[shard].log_tip().seq
    }

    /// Shard `shard`'s snapshot (see [`ShardSnapshot`]), handed to `then` under the shard lock,
    /// so that what `then` queues is ordered among the shard's commits.
    pub fn snapshot_shard<R>(
        &self,
        shard: usize,
        then: impl FnOnce(ShardSnapshot) -> R,
    ) -> Result<R, Error> {
        self.inner.shards[shard].snapshot(&*self.inner.clock, then)
    }

    /// Makes following shard `shard`'s documents `snapshot`'s and moves its log to the
    /// snapshot's position (refused, changing nothing, if its log is already past it). Blocks
    /// on storage.
    pub fn load_snapshot(&self, shard: usize, snapshot: &ShardSnapshot) -> Result<(), Error> {
        let handed_out = self.inner.catalog.read().last_uid();
        self.inner.shards[shard].load_snapshot(snapshot, handed_out)
    }
}
