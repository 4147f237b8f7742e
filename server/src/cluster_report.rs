//! What a cluster node says about its copies of the partitions in each heartbeat (the value of
//! its key in `mayfly-members`): which partitions it serves and how far their logs go, and which
//! it follows as a standby, how far its copy goes and how far behind the log it was. Any node
//! answers `Admin/GetPartitionMap` with every node's last report, so an operator sees the
//! standbys and their lag from one node. One line per partition, readable with `nats kv get`:
//!
//! ```text
//! serves 3 1042
//! follows 7 988 120
//! ```
//!
//! (`serves PARTITION LOG_END`, `follows PARTITION APPLIED LAG_MS`.) Lines a node does not
//! understand are skipped, so a newer node's report does not break an older node's status.

use std::fmt::Write;

/// One partition in a node's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionCopy {
    /// The node serves it; its change log ends at `log_end`.
    Serves { partition: u32, log_end: u64 },
    /// The node follows it: its copy holds the log up to `applied`, and when the node wrote
    /// the report it held everything the log held `lag_ms` before.
    Follows {
        partition: u32,
        applied: u64,
        lag_ms: u64,
    },
}

/// A node's report, as written in its heartbeat.
pub fn encode(copies: &[PartitionCopy]) -> String {
    let mut out = String::new();
    for copy in copies {
        // Writing to a String cannot fail.
        let _ = match copy {
            PartitionCopy::Serves { partition, log_end } => {
                writeln!(out, "serves {partition} {log_end}")
            }
            PartitionCopy::Follows {
                partition,
                applied,
                lag_ms,
            } => writeln!(out, "follows {partition} {applied} {lag_ms}"),
        };
    }
    out
}

/// The copies a report names, skipping what it does not understand.
pub fn decode(report: &[u8]) -> Vec<PartitionCopy> {
    let text = String::from_utf8_lossy(report);
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_ascii_whitespace();
            let kind = words.next()?;
            let mut number = || words.next()?.parse::<u64>().ok();
            let partition = u32::try_from(number()?).ok()?;
            match kind {
                "serves" => Some(PartitionCopy::Serves {
                    partition,
                    log_end: number()?,
                }),
                "follows" => Some(PartitionCopy::Follows {
                    partition,
                    applied: number()?,
                    lag_ms: number()?,
                }),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_and_skips_what_it_does_not_know() {
        let copies = [
            PartitionCopy::Serves {
                partition: 3,
                log_end: 1042,
            },
            PartitionCopy::Follows {
                partition: 7,
                applied: 988,
                lag_ms: 120,
            },
        ];
        let text = encode(&copies);
        assert_eq!(text, "serves 3 1042\nfollows 7 988 120\n");
        assert_eq!(decode(text.as_bytes()), copies);
        let newer = format!("{text}snapshots 3 9\nfollows x 1 2\nfollows 4 5\n\n");
        assert_eq!(decode(newer.as_bytes()), copies);
        assert_eq!(decode(b""), []);
    }
}
