//! Connection slots: a connection's place under `--max-connections` and
//! `--max-connections-per-ip`, held for its life with its client address's shares of the
//! budgets, and given back when it closes.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    sync::Arc,
};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{
    Limits,
    budget::{Budgets, PeerShares},
};

type Peers = Arc<Mutex<HashMap<IpAddr, Peer>>>;

/// What the connections from one client address share.
#[derive(Debug)]
struct Peer {
    open: usize,
    shares: PeerShares,
}

/// A connection's place under the limits, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    peers: Peers,
    ip: IpAddr,
    shares: PeerShares,
}

impl Slot {
    /// Its client address's shares of the budgets.
    pub(crate) fn shares(&self) -> &PeerShares {
        &self.shares
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut peers = self.peers.lock();
        if let Some(peer) = peers.get_mut(&self.ip) {
            peer.open -= 1;
            if peer.open == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}

/// The places under `--max-connections` and `--max-connections-per-ip`.
#[derive(Debug)]
pub(super) struct Slots {
    all: Arc<Semaphore>,
    pub(super) max: usize,
    /// Client networks with connections open.
    peers: Peers,
    pub(super) max_per_peer: usize,
    budgets: Budgets,
}

/// Why a connection got no place.
pub(super) enum Refused {
    Server,
    Peer,
}

impl Slots {
    pub(super) fn new(limits: &Limits, budgets: Budgets) -> Self {
        Slots {
            all: Arc::new(Semaphore::new(limits.max_connections)),
            max: limits.max_connections,
            peers: Arc::default(),
            max_per_peer: limits.max_connections_per_ip,
            budgets,
        }
    }

    pub(super) fn take(&self, remote: IpAddr) -> Result<Slot, Refused> {
        let permit = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refused::Server)?;
        let ip = network_of(remote);
        let mut peers = self.peers.lock();
        let peer = peers.entry(ip).or_insert_with(|| Peer {
            open: 0,
            shares: self.budgets.peer_shares(),
        });
        if peer.open >= self.max_per_peer {
            return Err(Refused::Peer);
        }
        peer.open += 1;
        Ok(Slot {
            _permit: permit,
            peers: self.peers.clone(),
            ip,
            shares: peer.shares.clone(),
        })
    }
}

/// The address a client's connections are counted under: an IPv6 client usually has a whole
/// /64 network to pick addresses from, so that network counts as one client.
fn network_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_address_cannot_take_every_place() {
        let slots = Slots::new(
            &Limits {
                max_connections: 10,
                max_connections_per_ip: 3,
                ..Limits::default()
            },
            Budgets::new(&Limits::default()),
        );
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let taken: Vec<Slot> = (0..3)
            .map(|_| slots.take(a).ok().expect("a place"))
            .collect();
        assert!(matches!(slots.take(a), Err(Refused::Peer)));
        let other = slots.take(b).ok().expect("another client has places");
        drop(taken);
        assert!(
            slots.peers.lock().get(&a).is_none(),
            "forgotten once closed"
        );
        assert!(slots.take(a).is_ok());
        drop(other);
        // The same /64 counts as one client; a v4-mapped address as its IPv4 one.
        let v6 = |s: &str| network_of(s.parse().expect("ip"));
        assert_eq!(v6("2001:db8::1"), v6("2001:db8::ffff:1234"));
        assert_ne!(v6("2001:db8::1"), v6("2001:db8:0:1::1"));
        assert_eq!(v6("::ffff:10.0.0.1"), a);
    }
}
