//! A follower's check of its partition's log (`docs/cluster.md`, invariant 5): each message
//! must continue the history it has applied: the same partition, the next positions, the link
//! of the message before it, and no older owner than the last. A gap, a rewind or a fork is
//! refused, never applied: the caller stops serving the partition and repairs.

use std::fmt;

use bytes::Bytes;

use crate::log_message::{DecodeError, LogMessage, link};

/// Where a partition's applied history stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chain {
    pub partition: u32,
    /// The last position applied (0: none).
    pub last: u64,
    /// The link after the last message applied (0: none).
    pub link: u64,
    /// The epoch of the last message applied.
    pub epoch: u64,
}

/// Why a message does not continue the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Divergence {
    /// The bytes are not a log message.
    Corrupt(DecodeError),
    /// It belongs to another partition's log.
    WrongPartition { found: u32 },
    /// Positions after `last` are missing: it starts after `found_after`.
    Gap { last: u64, found_after: u64 },
    /// It starts before the history's end: positions already applied came again.
    Rewind { last: u64, found_after: u64 },
    /// It starts at the right position but follows another history (its previous link is not
    /// the one applied): two different records at one position.
    Forked { at: u64 },
    /// An older owner wrote it after a newer one had.
    EpochBackwards { last: u64, found: u64 },
    /// The log ends before messages this copy applied from it: they were lost (stream
    /// sequences, `applied` being the last this copy applied).
    Shortened { applied: u64, end: u64 },
    /// The message at stream sequence `subject_seq`, which this node had applied (or, owning
    /// the partition, had acknowledged) up to position `last`, is gone from the log.
    Missing { subject_seq: u64, last: u64 },
    /// This copy's last message is of owner `epoch`, at position `last`, but the log's
    /// history (a snapshot's epoch table) ended that epoch at `ended`, or has no such epoch
    /// (`None`): the copy holds writes the log lost.
    Outlived {
        epoch: u64,
        last: u64,
        ended: Option<u64>,
    },
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Divergence::Corrupt(e) => write!(f, "{e}"),
            Divergence::WrongPartition { found } => {
                write!(f, "a message of partition {found} in this partition's log")
            }
            Divergence::Gap { last, found_after } => write!(
                f,
                "positions {} to {found_after} are missing from the log",
                last + 1
            ),
            Divergence::Rewind { last, found_after } => write!(
                f,
                "the log went back: a message after position {found_after} following position {last}"
            ),
            Divergence::Forked { at } => {
                write!(f, "the log holds another history after position {at}")
            }
            Divergence::EpochBackwards { last, found } => write!(
                f,
                "a message of owner epoch {found} after one of epoch {last}"
            ),
            Divergence::Shortened { applied, end } => write!(
                f,
                "the log ends at stream sequence {end}, though this copy applied it to {applied}: messages were lost"
            ),
            Divergence::Missing { subject_seq, last } => write!(
                f,
                "the log no longer holds the message at stream sequence {subject_seq} (to position {last}) that this node had applied or acknowledged: messages were lost"
            ),
            Divergence::Outlived {
                epoch,
                last,
                ended: Some(ended),
            } => write!(
                f,
                "this copy holds owner epoch {epoch}'s writes to position {last}, but the log's history ends that epoch at {ended}: writes were lost"
            ),
            Divergence::Outlived {
                epoch,
                last,
                ended: None,
            } => write!(
                f,
                "this copy holds owner epoch {epoch}'s writes to position {last}, an epoch the log's history lacks: writes were lost"
            ),
        }
    }
}

impl Chain {
    /// A partition with no history.
    pub fn new(partition: u32) -> Self {
        Chain {
            partition,
            last: 0,
            link: 0,
            epoch: 0,
        }
    }

    /// Checks that `bytes` continue this history; if they do, moves past the message and
    /// returns it (a snapshot's part continues it like any message: it holds no records).
    /// Nothing changes on a refusal.
    pub fn accept(&mut self, bytes: &Bytes) -> Result<LogMessage, Divergence> {
        let message = LogMessage::decode(bytes).map_err(Divergence::Corrupt)?;
        if message.partition != self.partition {
            return Err(Divergence::WrongPartition {
                found: message.partition,
            });
        }
        if message.epoch < self.epoch {
            return Err(Divergence::EpochBackwards {
                last: self.epoch,
                found: message.epoch,
            });
        }
        if message.after > self.last {
            return Err(Divergence::Gap {
                last: self.last,
                found_after: message.after,
            });
        }
        if message.after < self.last {
            return Err(Divergence::Rewind {
                last: self.last,
                found_after: message.after,
            });
        }
        if message.previous_link != self.link {
            return Err(Divergence::Forked { at: self.last });
        }
        *self = Chain {
            partition: self.partition,
            last: message.last(),
            link: link(message.previous_link, bytes),
            epoch: message.epoch,
        };
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_message::{MessageKind, tests::commit};

    /// A partition's history written by its owner: messages of `sizes` records each, chained.
    fn history(sizes: &[usize]) -> Vec<Bytes> {
        let mut owner = Chain::new(4);
        sizes
            .iter()
            .map(|&n| {
                let bytes = Bytes::from(commit(4, owner.last, owner.link, n).encode());
                owner
                    .accept(&bytes)
                    .expect("the owner's own history continues");
                bytes
            })
            .collect()
    }

    #[test]
    fn a_history_is_accepted_in_order() {
        let mut follower = Chain::new(4);
        for bytes in history(&[1, 3, 2]) {
            follower.accept(&bytes).expect("continues");
        }
        assert_eq!(follower.last, 6);
    }

    #[test]
    fn a_missing_message_is_a_gap_and_a_repeated_one_a_rewind() {
        let log = history(&[1, 3, 2]);
        let mut follower = Chain::new(4);
        follower.accept(&log[0]).expect("first");
        assert_eq!(
            follower.accept(&log[2]),
            Err(Divergence::Gap {
                last: 1,
                found_after: 4
            })
        );
        follower.accept(&log[1]).expect("second");
        assert_eq!(
            follower.accept(&log[1]),
            Err(Divergence::Rewind {
                last: 4,
                found_after: 1
            })
        );
        assert_eq!(follower.last, 4, "refusals change nothing");
    }

    #[test]
    fn another_history_at_the_same_position_is_a_fork() {
        let log = history(&[1, 3]);
        // Another owner wrote a different first message, then chained on it.
        let other_first = Bytes::from(
            LogMessage {
                watermark: 1,
                ..commit(4, 0, 0, 1)
            }
            .encode(),
        );
        let mut other = Chain::new(4);
        other.accept(&other_first).expect("its own");
        let other_second = Bytes::from(commit(4, other.last, other.link, 3).encode());
        let mut follower = Chain::new(4);
        follower.accept(&log[0]).expect("first");
        assert_eq!(
            follower.accept(&other_second),
            Err(Divergence::Forked { at: 1 })
        );
    }

    #[test]
    fn a_flipped_bit_is_caught_by_the_next_message() {
        let log = history(&[2, 2]);
        let mut damaged = log[0].to_vec();
        // Inside the first record's bytes (after the 54-byte header, the record count, and the
        // record's collection and length): the message still decodes.
        damaged[54 + 4 + 8 + 4 + 2] ^= 0x20;
        let mut follower = Chain::new(4);
        follower
            .accept(&Bytes::from(damaged))
            .expect("a damaged record still parses");
        assert_eq!(follower.accept(&log[1]), Err(Divergence::Forked { at: 2 }));
    }

    #[test]
    fn an_older_owner_and_another_partition_are_refused() {
        let log = history(&[1]);
        let mut follower = Chain {
            epoch: 5,
            ..Chain::new(4)
        };
        assert_eq!(
            follower.accept(&log[0]),
            Err(Divergence::EpochBackwards { last: 5, found: 3 })
        );
        let mut other = Chain::new(5);
        assert_eq!(
            other.accept(&log[0]),
            Err(Divergence::WrongPartition { found: 4 })
        );
    }

    #[test]
    fn a_snapshots_parts_continue_the_history_at_its_position() {
        let mut follower = Chain::new(4);
        let log = history(&[1, 2]);
        for bytes in &log {
            follower.accept(bytes).expect("continues");
        }
        let part = |link| LogMessage {
            kind: MessageKind::Snapshot {
                part: 0,
                parts: 1,
                bytes: Bytes::from_static(b"state"),
            },
            after: 3,
            previous_link: link,
            records: Vec::new(),
            remembered: Vec::new(),
            ..commit(4, 0, 0, 0)
        };
        let bytes = Bytes::from(part(follower.link).encode());
        follower
            .accept(&bytes)
            .expect("a part at the history's end");
        assert_eq!(follower.last, 3, "it moves no position");
        // A copy behind it finds a gap: it loads the snapshot instead (`follower.rs`).
        let mut behind = Chain::new(4);
        behind.accept(&log[0]).expect("first");
        assert_eq!(
            behind.accept(&bytes),
            Err(Divergence::Gap {
                last: 1,
                found_after: 3
            })
        );
    }
}
