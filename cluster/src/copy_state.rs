//! Where a node's copy of a partition stands in the partition's log, kept in the node's own
//! storage beside the copy (docs/cluster.md, "A node's own copy"). Written after the copy's
//! writes it describes, so a state that survives a crash finds them there too; a copy holding
//! more than its state says (an owner's commits after its takeover, a message applied just
//! before a crash) is not known to be the log's, and is rebuilt from the log at the next start.

use bytes::Bytes;
use mayfly_engine::{engine::Engine, storage::Storage};

use crate::{
    chain::Chain,
    epochs::Epochs,
    follower::Followed,
    log_message::{DecodeError, Reader},
};

/// The state's format: the copy is the log up to the position it names.
const FORMAT: u8 = 1;

/// The same fields while a snapshot is being loaded: the copy is neither the old one nor the
/// new, and the position is the old copy's.
const LOADING: u8 = 0;

/// The key of partition `partition`'s state.
pub fn key(partition: u32) -> String {
    format!("partition.{partition}")
}

/// What a node restarting finds of a partition's copy.
#[derive(Debug)]
pub enum Stored {
    /// No state: nothing known of the copy.
    Unknown,
    /// A snapshot's load was cut off: the copy is a mix; before the load it stood here.
    Loading(Box<Followed>),
    /// The copy is the log up to here.
    At(Box<Followed>),
}

/// The state's bytes: `format | last | link | epoch | stream sequence (u64 each) | epochs`.
fn encode(format: u8, f: &Followed) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(format);
    for word in [f.chain.last, f.chain.link, f.chain.epoch, f.subject_seq] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    f.epochs.encode(&mut out);
    out
}

/// Reads partition `partition`'s state.
pub fn decode(partition: u32, bytes: &Bytes) -> Result<Stored, DecodeError> {
    let mut r = Reader { bytes, at: 0 };
    let format = r.u8()?;
    if format != FORMAT && format != LOADING {
        return Err(DecodeError("unknown copy state format"));
    }
    let (last, link, epoch, subject_seq) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let epochs = Epochs::decode(&mut r)?;
    if r.at != bytes.len() {
        return Err(DecodeError("bytes after the copy state"));
    }
    let chain = Chain {
        partition,
        last,
        link,
        epoch,
    };
    let f = Box::new(Followed::resumed(chain, subject_seq, epochs));
    Ok(if format == LOADING {
        Stored::Loading(f)
    } else {
        Stored::At(f)
    })
}

/// Reads partition `partition`'s state from the node's storage. Unreadable: the node cannot
/// tell what the log must hold, and says why (it must not start over the copy).
pub fn load(storage: &dyn Storage, partition: u32) -> Result<Stored, String> {
    match storage.node_state(&key(partition)) {
        Ok(Some(bytes)) => decode(partition, &bytes)
            .map_err(|e| format!("partition {partition}'s copy state is unreadable: {e}")),
        Ok(None) => Ok(Stored::Unknown),
        Err(e) => Err(format!(
            "partition {partition}'s copy state was not read: {e}"
        )),
    }
}

/// What a kept state says of the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// The copy is the log up to the position named (written after every write of the copy
    /// made so far).
    At,
    /// The copy is being changed wholesale (a snapshot loaded into it, or emptied to be
    /// rebuilt); the position named is what the log must still hold (see
    /// [`Followed::witness`]).
    Loading,
}

/// Where a node's state is written: through its engine, or to its storage (an owner's
/// publisher, or before the engine is opened).
pub trait StateStore {
    fn put_state(&self, key: &str, value: &[u8]) -> Result<(), String>;
}

impl StateStore for Engine {
    fn put_state(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.put_node_state(key, value).map_err(|e| e.to_string())
    }
}

impl StateStore for dyn Storage {
    fn put_state(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.put_node_state(key, value).map_err(|e| e.to_string())
    }
}

/// Records what `kept` says of the copy of `partition`, standing at `f`.
pub fn save(to: &(impl StateStore + ?Sized), partition: u32, kept: Kept, f: &Followed) {
    let format = match kept {
        Kept::At => FORMAT,
        Kept::Loading => LOADING,
    };
    // A state not written leaves an older one, which the copy outgrows: rebuilt at the next
    // start. A storage that failed refuses every write anyway.
    if let Err(e) = to.put_state(&key(partition), &encode(format, f)) {
        tracing::warn!(partition, error = %e, "this node's copy state was not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_state_round_trips() {
        let mut epochs = Epochs::default();
        epochs.note(1, 0);
        epochs.note(4, 77);
        let chain = Chain {
            partition: 9,
            last: 120,
            link: 0xfeed,
            epoch: 4,
        };
        let f = Followed::resumed(chain, 455, epochs.clone());
        let bytes = Bytes::from(encode(FORMAT, &f));
        match decode(9, &bytes).expect("decoded") {
            Stored::At(back) => {
                assert_eq!(back.chain, chain);
                assert_eq!(back.subject_seq, 455);
                assert_eq!(back.epochs, epochs);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode(9, &Bytes::from(encode(LOADING, &f))),
            Ok(Stored::Loading(back)) if back.chain == chain
        ));
        assert!(decode(9, &bytes.slice(..20)).is_err());
    }
}
