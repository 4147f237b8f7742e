//! Reads the server's Prometheus text metrics: enough HTTP/1.1 for one GET, enough parsing for
//! counters, gauges and one histogram.

use std::{collections::BTreeMap, net::SocketAddr};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// One scrape: series name (with labels) to value.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape(BTreeMap<String, f64>);

pub(crate) async fn scrape(addr: SocketAddr) -> Result<Scrape, Box<dyn std::error::Error>> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let mut series = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        if let Some((name, value)) = line.rsplit_once(' ')
            && let Ok(value) = value.parse()
        {
            series.insert(name.to_owned(), value);
        }
    }
    Ok(Scrape(series))
}

impl Scrape {
    pub(crate) fn value(&self, name: &str) -> f64 {
        self.get(name).unwrap_or(0.0)
    }

    /// A series' value, if the scrape has it.
    pub(crate) fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// The sum of `name`'s series whose labels include each of `labels` (0 if none).
    pub(crate) fn labelled(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(series, _)| {
                series
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('{'))
                    .is_some_and(|rest| {
                        labels
                            .iter()
                            .all(|(key, value)| rest.contains(&format!("{key}=\"{value}\"")))
                    })
            })
            .map(|(_, value)| value)
            .sum()
    }

    /// Cumulative bucket counts `(le, count)` of `histogram` in `self` minus `baseline`.
    pub(crate) fn histogram_delta(&self, histogram: &str, baseline: &Scrape) -> Vec<(f64, f64)> {
        let prefix = format!("{histogram}_bucket{{le=\"");
        let mut buckets: Vec<(f64, f64)> = self
            .0
            .iter()
            .filter_map(|(name, count)| {
                let le = name.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, count - baseline.value(name)))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets
    }
}

/// The q-quantile of cumulative buckets: linear interpolation within the bucket (as
/// Prometheus's histogram_quantile does), and that bucket's upper bound.
pub(crate) fn quantile(buckets: &[(f64, f64)], q: f64) -> (f64, f64) {
    let total = buckets.last().map_or(0.0, |b| b.1);
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return (lower.0, le);
            }
            let fraction = if count > lower.1 {
                (rank - lower.1) / (count - lower.1)
            } else {
                1.0
            };
            return (lower.0 + (le - lower.0) * fraction, le);
        }
        lower = (le, count);
    }
    (f64::NAN, f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_buckets() {
        let buckets = [
            (0.01, 50.0),
            (0.1, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ];
        let (p50, bound) = quantile(&buckets, 0.5);
        assert!((p50 - 0.01).abs() < 1e-9 && bound == 0.01);
        let (p70, bound) = quantile(&buckets, 0.7);
        assert!((p70 - 0.055).abs() < 1e-9 && bound == 0.1, "{p70}");
        assert_eq!(quantile(&buckets, 0.99).1, 1.0);
    }
}
