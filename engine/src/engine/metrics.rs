//! Expiry metrics in Prometheus form: counters and the purge-lag histogram are updated as the
//! engine works; gauges are read from the shards at each scrape.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::Counter, gauge::ConstGauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use super::Engine;

/// Purge lag buckets in seconds: fine below 100 ms, where the purge is meant to stay, and
/// close enough above it that a backlog's percentiles are read to within a third or so.
const LAG_BUCKETS: [f64; 25] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
    2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
];

/// Counters and histograms the engine updates as it works.
#[derive(Debug)]
pub struct EngineMetrics {
    /// Documents whose expiry took effect: purged, or overwritten while expired.
    pub(crate) expired: Counter,
    /// Expired documents deleted from storage by the purge.
    pub(crate) purged: Counter,
    /// Expiry instant to storage freed, per purged document.
    pub(crate) purge_lag: Histogram,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            expired: Counter::default(),
            purged: Counter::default(),
            purge_lag: Histogram::new(LAG_BUCKETS),
        }
    }
}

/// Registers the engine's metrics under `mayfly_`: the counters in `metrics`, and gauges read
/// at each scrape from the engine `current` returns (none while storage is being reopened).
pub fn register(
    metrics: &EngineMetrics,
    current: impl Fn() -> Option<Engine> + Send + Sync + 'static,
    registry: &mut Registry,
) {
    registry.register(
        "mayfly_documents_expired",
        "Documents whose expiry took effect (purged, or overwritten after expiring)",
        metrics.expired.clone(),
    );
    registry.register(
        "mayfly_documents_purged",
        "Expired documents deleted from storage by the background purge",
        metrics.purged.clone(),
    );
    registry.register_with_unit(
        "mayfly_purge_lag",
        "Time from a document's expiry instant until the purge freed its storage",
        Unit::Seconds,
        metrics.purge_lag.clone(),
    );
    registry.register_collector(Box::new(ExpiryGauges {
        current: Box::new(current),
    }));
}

/// Gauges computed from the shards at scrape time.
struct ExpiryGauges {
    current: Box<dyn Fn() -> Option<Engine> + Send + Sync>,
}

impl std::fmt::Debug for ExpiryGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpiryGauges").finish_non_exhaustive()
    }
}

impl Collector for ExpiryGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let engine = (self.current)();
        let writable = (
            "mayfly_storage_writable",
            "1 while storage can make writes durable; 0 once an fsync or a journal write failed (writes are refused and health reports NOT_SERVING until the data directory is reopened)",
            engine
                .as_ref()
                .map_or(0, |e| u64::from(e.storage_failure().is_none())),
        );
        let mut gauges = vec![writable];
        if let Some(engine) = &engine {
            let stats = engine.expiry_stats();
            gauges.extend([
                (
                    "mayfly_purge_backlog_documents",
                    "Expired entries not yet processed by the purge, as of its last pass (lower bound)",
                    stats.purge_backlog,
                ),
                (
                    "mayfly_documents",
                    "Documents held, including expired ones not yet purged",
                    stats.documents,
                ),
                (
                    "mayfly_expiry_tracked_documents",
                    "Documents whose expiry is tracked by a timer or an inherit queue",
                    stats.tracked_documents,
                ),
                (
                    "mayfly_expiry_bookkeeping_bytes",
                    "Bytes allocated for expiry tracking: timer nodes, inherit-queue entries, timer handles",
                    stats.bookkeeping_bytes,
                ),
            ]);
        }
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value as i64);
            let metric_encoder =
                encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric_encoder)?;
        }
        Ok(())
    }
}

/// Expiry bookkeeping, summed over shards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpiryStats {
    /// See `mayfly_purge_backlog_documents`.
    pub purge_backlog: u64,
    /// Documents held.
    pub documents: u64,
    /// Documents with a timer or a live inherit-queue entry.
    pub tracked_documents: u64,
    /// Bytes of expiry bookkeeping.
    pub bookkeeping_bytes: u64,
}

impl Engine {
    /// Reads expiry bookkeeping from every shard (each lock held briefly).
    pub fn expiry_stats(&self) -> ExpiryStats {
        let mut stats = ExpiryStats::default();
        for shard in self.shards() {
            shard.add_expiry_stats(&mut stats);
        }
        stats
    }
}
