//! A partition's owner epochs and where each began in its log (Kafka's leader-epoch table;
//! docs/cluster.md, "Repair"). Each snapshot carries it, so that a node whose copy is behind a
//! purged log can still tell a copy that is a prefix of the log's history from one holding
//! writes the log lost: a copy whose last message is of an owner epoch that, in the log's
//! history, ended before the copy's last position holds positions the log gave to later owners.

use crate::{
    chain::Divergence,
    log_message::{DecodeError, Reader},
};

/// The most epochs a table keeps (16 bytes each): the oldest go first. A copy whose epoch is
/// older than every one kept is checked against the first kept.
const MOST: usize = 10_000;

/// Each owner epoch of a partition's log, in order, with the position its takeover followed:
/// the positions after it, up to the next epoch's, are that owner's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Epochs(Vec<(u64, u64)>);

impl Epochs {
    /// Notes a message of owner `epoch` following position `after`: the first of its epoch (a
    /// takeover) begins the epoch there; later ones change nothing.
    pub fn note(&mut self, epoch: u64, after: u64) {
        if self.0.last().is_none_or(|&(last, _)| epoch > last) {
            self.0.push((epoch, after));
            if self.0.len() > MOST {
                self.0.remove(0);
            }
        }
    }

    /// Whether a copy whose last message is of owner `epoch` and ends at position `last` is a
    /// prefix of the history this table describes. Refused: the copy holds writes at positions
    /// the history gives another owner (its epoch ended earlier there, or the history has no
    /// such epoch), writes a log that lost them cannot bring back. An empty table (or copy)
    /// tells nothing, and passes.
    pub fn check_prefix(&self, last: u64, epoch: u64) -> Result<(), Divergence> {
        let (Some(&(first, first_after)), Some(&(newest, _))) = (self.0.first(), self.0.last())
        else {
            return Ok(());
        };
        if last == 0 && epoch == 0 {
            return Ok(());
        }
        let outlived = |ended: u64| {
            Err(Divergence::Outlived {
                epoch,
                last,
                ended: Some(ended),
            })
        };
        if epoch < first {
            // Older than the table reaches: that epoch ended by the first kept one's start.
            return if last <= first_after {
                Ok(())
            } else {
                outlived(first_after)
            };
        }
        if epoch > newest {
            return Err(Divergence::Outlived {
                epoch,
                last,
                ended: None,
            });
        }
        let Some(i) = self.0.iter().position(|&(e, _)| e == epoch) else {
            return Err(Divergence::Outlived {
                epoch,
                last,
                ended: None,
            });
        };
        let began = self.0[i].1;
        if last < began {
            // The copy has this owner's messages where the history has an earlier owner's.
            return Err(Divergence::Forked { at: last });
        }
        match self.0.get(i + 1) {
            Some(&(_, next_after)) if last > next_after => outlived(next_after),
            _ => Ok(()),
        }
    }

    /// Appends the table: `count (u32) | (epoch (u64) | after (u64))*`, big-endian.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.0.len() as u32).to_be_bytes());
        for (epoch, after) in &self.0 {
            out.extend_from_slice(&epoch.to_be_bytes());
            out.extend_from_slice(&after.to_be_bytes());
        }
    }

    /// Reads a table [`Epochs::encode`] wrote; refuses one out of order or over [`MOST`].
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.u32()? as usize;
        if n > MOST {
            return Err(DecodeError("an epoch table longer than any kept"));
        }
        let mut table: Vec<(u64, u64)> = Vec::new();
        for _ in 0..n {
            let entry = (r.u64()?, r.u64()?);
            if let Some(&(epoch, after)) = table.last()
                && (entry.0 <= epoch || entry.1 < after)
            {
                return Err(DecodeError("an epoch table out of order"));
            }
            table.push(entry);
        }
        Ok(Epochs(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// Epoch 1 from the start, epoch 3 after position 40, epoch 7 after 90.
    fn history() -> Epochs {
        let mut e = Epochs::default();
        for (epoch, after) in [(1, 0), (1, 5), (3, 40), (3, 41), (2, 50), (7, 90)] {
            e.note(epoch, after);
        }
        e
    }

    #[test]
    fn a_copy_is_a_prefix_only_while_its_epoch_covers_its_last_position() {
        let e = history();
        assert_eq!(
            e.0,
            vec![(1, 0), (3, 40), (7, 90)],
            "only each epoch's first"
        );
        for (last, epoch) in [
            (0, 0),
            (10, 1),
            (40, 1),
            (40, 3),
            (90, 3),
            (90, 7),
            (500, 7),
        ] {
            assert_eq!(
                e.check_prefix(last, epoch),
                Ok(()),
                "{last} of epoch {epoch}"
            );
        }
        // Epoch 1's writes after 40 were lost: the history gave 41.. to epoch 3.
        assert_eq!(
            e.check_prefix(45, 1),
            Err(Divergence::Outlived {
                epoch: 1,
                last: 45,
                ended: Some(40)
            })
        );
        assert!(e.check_prefix(91, 3).is_err(), "epoch 3 ended at 90");
        assert!(e.check_prefix(60, 2).is_err(), "no epoch 2 in the history");
        assert!(
            e.check_prefix(95, 8).is_err(),
            "a later owner than the history's"
        );
        assert_eq!(e.check_prefix(30, 3), Err(Divergence::Forked { at: 30 }));
        assert_eq!(Epochs::default().check_prefix(45, 1), Ok(()));
    }

    #[test]
    fn a_table_round_trips_and_refuses_disorder() {
        let e = history();
        let mut out = Vec::new();
        e.encode(&mut out);
        let bytes = Bytes::from(out);
        let mut r = Reader {
            bytes: &bytes,
            at: 0,
        };
        assert_eq!(Epochs::decode(&mut r).expect("decoded"), e);
        assert_eq!(r.at, bytes.len());
        let mut out = Vec::new();
        Epochs(vec![(3, 40), (1, 50)]).encode(&mut out);
        let bytes = Bytes::from(out);
        let mut r = Reader {
            bytes: &bytes,
            at: 0,
        };
        assert!(Epochs::decode(&mut r).is_err());
    }

    #[test]
    fn a_long_table_keeps_its_latest_epochs() {
        let mut e = Epochs::default();
        for epoch in 1..=(MOST as u64 + 10) {
            e.note(epoch, epoch * 10);
        }
        assert_eq!(e.0.len(), MOST);
        assert_eq!(e.0[0], (11, 110));
        assert_eq!(
            e.check_prefix(110, 3),
            Ok(()),
            "older than kept, ended in time"
        );
        assert!(e.check_prefix(111, 3).is_err());
    }
}
