//! `GET /metrics` in Prometheus (OpenMetrics) text, on its own listener.

use std::{future::Future, sync::Arc};

use axum::{Router, http::header, routing::get};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, text::encode},
    metrics::{
        counter::ConstCounter,
        gauge::{ConstGauge, Gauge},
    },
    registry::Registry,
};
use tokio::net::TcpListener;

use crate::{
    cluster_metrics::{ClusterCollector, ClusterMetrics},
    current_engine::CurrentEngine,
    engine::{Budget, register_metrics},
    throughput_limit::Provisioned,
};

/// The registry served: the metrics of the engine in service, the change feed streams open,
/// the process's resident memory and CPU time, and a cluster node's partitions.
pub(crate) fn registry(
    current: &CurrentEngine,
    feed_streams: &Gauge,
    provisioned: &Arc<Provisioned>,
    cluster: Option<Arc<ClusterMetrics>>,
) -> Registry {
    let mut registry = Registry::default();
    registry.register(
        "mayfly_change_feed_streams",
        "Change feed streams open",
        feed_streams.clone(),
    );
    let metrics = current.metrics().clone();
    registry.register_collector(Box::new(ThroughputCollector {
        current: current.clone(),
        provisioned: provisioned.clone(),
    }));
    let current = current.clone();
    register_metrics(&metrics, move || current.get().ok(), &mut registry);
    registry.register_collector(Box::new(ResidentMemory));
    registry.register_collector(Box::new(ProcessCpu));
    if let Some(cluster) = cluster {
        registry.register_collector(Box::new(ClusterCollector(cluster)));
    }
    registry
}

/// Serves the registry until `shutdown` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Registry,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let registry = Arc::new(registry);
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move {
                let mut body = String::new();
                // Writing to a String cannot fail.
                let _ = encode(&mut body, &registry);
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Per collection: request units consumed, requests throttled, and the throughput provisioned
/// now (a database's shared throughput under `collection=""`).
#[derive(Debug)]
struct ThroughputCollector {
    current: CurrentEngine,
    provisioned: Arc<Provisioned>,
}

impl Collector for ThroughputCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Ok(engine) = self.current.get() else {
            return Ok(());
        };
        let collections = engine.all_collections();
        let labels = |database: &dyn std::fmt::Display, collection: &dyn std::fmt::Display| {
            [
                ("database", database.to_string()),
                ("collection", collection.to_string()),
            ]
        };
        let mut consumed = encoder.encode_descriptor(
            "mayfly_request_units_consumed",
            "Request units the collection's requests were charged since the server started",
            None,
            ConstCounter::new(0f64).metric_type(),
        )?;
        for (info, _) in &collections {
            let used = self.provisioned.usage(info.uid);
            ConstCounter::new(used.map_or(0.0, |u| u.consumed()))
                .encode(consumed.encode_family(&labels(&info.database, &info.id))?)?;
        }
        let mut throttled = encoder.encode_descriptor(
            "mayfly_requests_throttled",
            "The collection's requests refused REQUEST_RATE_TOO_LARGE since the server started",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (info, _) in &collections {
            let used = self.provisioned.usage(info.uid);
            ConstCounter::new(used.map_or(0, |u| u.throttled()))
                .encode(throttled.encode_family(&labels(&info.database, &info.id))?)?;
        }
        let mut provisioned = encoder.encode_descriptor(
            "mayfly_provisioned_request_units_per_second",
            "Throughput provisioned now: manual, or what autoscale scaled to; a database's shared one under collection=\"\"",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        let mut shared_seen = std::collections::HashSet::new();
        for (info, shared) in &collections {
            let (budget, throughput, collection) = match (info.settings.throughput(), shared) {
                (Some(own), _) => (Budget::Collection(info.uid), own, info.id.to_string()),
                (None, Some((uid, shared))) if shared_seen.insert(*uid) => {
                    (Budget::Database(*uid), *shared, String::new())
                }
                _ => continue,
            };
            ConstGauge::new(i64::from(self.provisioned.provisioned(budget, throughput)))
                .encode(provisioned.encode_family(&labels(&info.database, &collection))?)?;
        }
        Ok(())
    }
}

/// `mayfly_process_resident_memory_bytes`, from /proc/self/statm (Linux; absent elsewhere).
#[derive(Debug)]
struct ResidentMemory;

impl Collector for ResidentMemory {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(bytes) = resident_bytes() else {
            return Ok(());
        };
        let gauge = ConstGauge::new(bytes as i64);
        let metric = encoder.encode_descriptor(
            "mayfly_process_resident_memory_bytes",
            "Resident set size of the server process",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // 4 KiB pages: the page size of the Linux targets Mayfly runs on.
    Some(pages * 4096)
}

/// `mayfly_process_cpu_seconds_total`, user plus system CPU time of the whole process from
/// /proc/self/stat (Linux; absent elsewhere): what load generators divide by operations to
/// report server CPU per operation.
#[derive(Debug)]
struct ProcessCpu;

impl Collector for ProcessCpu {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(seconds) = cpu_seconds() else {
            return Ok(());
        };
        let counter = ConstCounter::new(seconds);
        let metric = encoder.encode_descriptor(
            "mayfly_process_cpu_seconds",
            "User and system CPU time of the server process",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11); // field 14, utime
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // /proc counts in USER_HZ ticks, 100 per second on every Linux target.
    Some((utime + stime) as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn cpu_time_grows_with_work() {
        let before = super::cpu_seconds().expect("Linux has /proc/self/stat");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = super::cpu_seconds().expect("readable");
        assert!(after - before >= 0.1, "{before} -> {after}");
    }
}
