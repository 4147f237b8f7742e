//! A cluster node's metrics (docs/cluster.md, "Operations"), per partition: whether this node
//! serves it, how often it took it over after a lapse or was handed it, how many of its
//! commits the log has not acknowledged yet, and whether its log diverged; and the node's
//! clock skew against the NATS servers' time, beyond which it owns nothing.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
};

use mayfly_cluster::{Clocks, PublishQueue};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// How far this node's wall clock may be from the NATS servers' before it owns nothing: an
/// owner's clock decides expiry, and the next owner starts from its lease's end.
pub(crate) const MAX_CLOCK_SKEW_MS: i64 = 1_000;

/// One partition's figures.
#[derive(Debug, Default)]
pub(crate) struct PartitionMetrics {
    /// This node serves it now.
    pub(crate) served: AtomicBool,
    /// Taken over by this node after its lease lapsed (or was free).
    pub(crate) failovers: AtomicU64,
    /// Handed to this node by its previous owner.
    pub(crate) handovers: AtomicU64,
    /// Its log does not continue the history this node applied.
    pub(crate) diverged: AtomicBool,
    /// This node follows it as a standby (keeps its copy caught up with the log).
    pub(crate) following: AtomicBool,
    /// How far this node's copy goes in its change log (while following).
    pub(crate) applied: AtomicU64,
    /// When (wall clock, Unix ms) the last catch-up that reached the log's end began: the copy
    /// holds everything the log held then.
    pub(crate) caught_up_at_ms: AtomicU64,
}

impl PartitionMetrics {
    /// Its copy holds the log up to `applied`, as the log was at `since_ms`.
    pub(crate) fn caught_up(&self, applied: u64, since_ms: u64) {
        self.applied.store(applied, Ordering::Relaxed);
        self.caught_up_at_ms.store(since_ms, Ordering::Relaxed);
        self.following.store(true, Ordering::Relaxed);
    }

    /// How long ago (ms, at `now_ms`) the copy last held everything the log held; `None`
    /// unless this node follows the partition.
    pub(crate) fn apply_lag_ms(&self, now_ms: u64) -> Option<u64> {
        self.following
            .load(Ordering::Relaxed)
            .then(|| now_ms.saturating_sub(self.caught_up_at_ms.load(Ordering::Relaxed)))
    }
}

/// The node's figures, read by `GET /metrics`.
#[derive(Debug)]
pub(crate) struct ClusterMetrics {
    pub(crate) partitions: Vec<PartitionMetrics>,
    queues: Vec<Arc<PublishQueue>>,
    /// This node's wall clock minus the NATS servers' (ms), as last measured.
    clock_skew_ms: AtomicI64,
    /// The skew is within [`MAX_CLOCK_SKEW_MS`], as far as the samples confirm.
    clock_ok: AtomicBool,
    /// Every NATS server was seen, at this node's start, to fsync before it acknowledges.
    nats_fsync_confirmed: AtomicBool,
}

impl ClusterMetrics {
    pub(crate) fn new(queues: Vec<Arc<PublishQueue>>) -> Self {
        ClusterMetrics {
            partitions: queues.iter().map(|_| PartitionMetrics::default()).collect(),
            queues,
            clock_skew_ms: AtomicI64::new(0),
            clock_ok: AtomicBool::new(true),
            nats_fsync_confirmed: AtomicBool::new(false),
        }
    }

    /// Records a measured skew (shown as measured); whether it is within
    /// [`MAX_CLOCK_SKEW_MS`].
    pub(crate) fn record_clock_skew(&self, skew_ms: i64) -> bool {
        self.clock_skew_ms.store(skew_ms, Ordering::Relaxed);
        skew_ms.abs() <= MAX_CLOCK_SKEW_MS
    }

    /// Whether this node may own partitions by its clock (see [`ClusterMetrics::set_clock_ok`]).
    pub(crate) fn clock_ok(&self) -> bool {
        self.clock_ok.load(Ordering::Relaxed)
    }

    /// Whether every NATS server was seen to fsync before it acknowledges (`nats_sync_check`).
    pub(crate) fn set_nats_fsync_confirmed(&self, confirmed: bool) {
        self.nats_fsync_confirmed
            .store(confirmed, Ordering::Relaxed);
    }

    /// Decides whether this node's clock is trusted (after samples confirm it either way).
    pub(crate) fn set_clock_ok(&self, ok: bool) {
        self.clock_ok.store(ok, Ordering::Relaxed);
    }
}

/// This node's wall clock minus the NATS servers', from a write it sent after reading
/// `before` on its clock, which the server stamped `server`, and whose answer it had by
/// `after`: 0 while the stamp falls within the exchange, else how far outside it.
pub(crate) fn clock_skew_ms(before: u64, server: u64, after: u64) -> i64 {
    if server < before {
        (before - server) as i64
    } else if server > after {
        -((server - after) as i64)
    } else {
        0
    }
}

/// A metric per partition: its name, help, and its value for a partition.
type PerPartition<'a, T> = (&'static str, &'static str, &'a dyn Fn(usize) -> T);

/// A Prometheus collector over [`ClusterMetrics`].
#[derive(Debug)]
pub(crate) struct ClusterCollector(pub(crate) Arc<ClusterMetrics>);

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let m = &self.0;
        let label = |p: usize| [("partition", p.to_string())];
        let gauges: [PerPartition<'_, i64>; 3] = [
            (
                "mayfly_cluster_partition_served",
                "1 while this node serves the partition",
                &|p| i64::from(m.partitions[p].served.load(Ordering::Relaxed)),
            ),
            (
                "mayfly_cluster_log_lag",
                "Commits of the partition this node made that its log has not acknowledged yet",
                &|p| m.queues[p].backlog() as i64,
            ),
            (
                "mayfly_cluster_log_divergence",
                "1 if the partition's log does not continue the history this node applied",
                &|p| i64::from(m.partitions[p].diverged.load(Ordering::Relaxed)),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family =
                encoder.encode_descriptor(name, help, None, ConstGauge::new(0i64).metric_type())?;
            for p in 0..m.partitions.len() {
                ConstGauge::new(value(p)).encode(family.encode_family(&label(p))?)?;
            }
        }
        let counters: [PerPartition<'_, u64>; 2] = [
            (
                "mayfly_cluster_failovers",
                "Times this node took the partition over after its lease lapsed (or was free)",
                &|p| m.partitions[p].failovers.load(Ordering::Relaxed),
            ),
            (
                "mayfly_cluster_handovers",
                "Times the partition was handed to this node by its previous owner",
                &|p| m.partitions[p].handovers.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for p in 0..m.partitions.len() {
                ConstCounter::new(value(p)).encode(family.encode_family(&label(p))?)?;
            }
        }
        // Only for what this node follows: a served partition's log is its own, and one it
        // neither serves nor follows has no copy here to lag.
        let now = mayfly_cluster::SystemClocks.wall_ms();
        let mut family = encoder.encode_descriptor(
            "mayfly_cluster_apply_lag_seconds",
            "For a partition this node follows as a standby: how long ago its copy last held everything the partition's log held",
            None,
            ConstGauge::new(0f64).metric_type(),
        )?;
        for (p, partition) in m.partitions.iter().enumerate() {
            if let Some(lag) = partition.apply_lag_ms(now) {
                ConstGauge::new(lag as f64 / 1_000.0).encode(family.encode_family(&label(p))?)?;
            }
        }
        let unconfirmed =
            ConstGauge::new(i64::from(!m.nats_fsync_confirmed.load(Ordering::Relaxed)));
        unconfirmed.encode(encoder.encode_descriptor(
            "mayfly_cluster_nats_fsync_unconfirmed",
            "1 if this node could not confirm at its start that every NATS server runs JetStream with sync_interval: always (--cluster-nats-monitor)",
            None,
            unconfirmed.metric_type(),
        )?)?;
        let skew = ConstGauge::new(m.clock_skew_ms.load(Ordering::Relaxed) as f64 / 1_000.0);
        skew.encode(encoder.encode_descriptor(
            "mayfly_cluster_clock_skew_seconds",
            "This node's wall clock minus the NATS servers' time, as last measured; beyond 1 s the node owns nothing",
            None,
            skew.metric_type(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_lag_is_the_age_of_the_log_the_copy_last_held_whole() {
        let m = PartitionMetrics::default();
        assert_eq!(m.apply_lag_ms(5_000), None, "not followed: no copy to lag");
        m.caught_up(42, 4_200);
        assert_eq!(m.apply_lag_ms(5_000), Some(800));
        assert_eq!(m.applied.load(Ordering::Relaxed), 42);
        // A clock read before the catch-up began does not go negative.
        assert_eq!(m.apply_lag_ms(4_000), Some(0));
        m.following.store(false, Ordering::Relaxed);
        assert_eq!(m.apply_lag_ms(5_000), None);
    }

    #[test]
    fn skew_is_what_falls_outside_the_exchange() {
        assert_eq!(clock_skew_ms(1_000, 1_005, 1_010), 0);
        assert_eq!(clock_skew_ms(1_000, 1_000, 1_000), 0);
        // The server stamped the write before this node sent it: this clock is ahead.
        assert_eq!(clock_skew_ms(3_000, 1_000, 3_010), 2_000);
        // After this node had the answer: this clock is behind.
        assert_eq!(clock_skew_ms(1_000, 2_510, 1_010), -1_500);
        let metrics = ClusterMetrics::new(Vec::new());
        assert!(metrics.record_clock_skew(-1_000));
        assert!(!metrics.record_clock_skew(1_001));
        assert!(
            metrics.clock_ok(),
            "decided by the heartbeat, not one sample"
        );
    }
}
