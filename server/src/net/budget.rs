//! Memory budgets for what clients make the server hold: responses waiting to be read (shared
//! by all clients, with a share per client address so that one client cannot take it all) and
//! request messages on their way in.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// Budgets count kibibytes, so that a `u32` of permits covers any response.
pub(crate) const UNIT: usize = 1024;

/// The memory for responses waiting to be read.
#[derive(Debug, Clone)]
pub struct ResponseBudget {
    all: Arc<Semaphore>,
    total_units: u32,
    per_peer_units: u32,
}

/// One client address's share of a [`ResponseBudget`].
#[derive(Debug, Clone)]
pub struct PeerShare(Arc<Semaphore>);

/// What one response holds of the budget, given back when dropped.
#[derive(Debug, Default)]
pub(crate) struct Charge {
    all: Option<OwnedSemaphorePermit>,
    peer: Option<OwnedSemaphorePermit>,
    units: u32,
}

impl ResponseBudget {
    /// `bytes` for all clients, `per_peer_bytes` of it for one client address.
    pub fn new(bytes: usize, per_peer_bytes: usize) -> Self {
        let units = |b: usize| u32::try_from(b / UNIT).unwrap_or(u32::MAX);
        let total_units = units(bytes);
        ResponseBudget {
            all: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
            per_peer_units: units(per_peer_bytes).min(total_units),
        }
    }

    /// A new client address's share.
    pub fn peer_share(&self) -> PeerShare {
        PeerShare(Arc::new(Semaphore::new(self.per_peer_units as usize)))
    }

    /// Grows `charge` to cover `bytes`; RESOURCE_EXHAUSTED, leaving it as it was, if the budget
    /// (or `peer`'s share of it) has not that much free. One response may always have the
    /// whole of either, so that none is refused forever.
    pub(crate) fn grow(
        &self,
        charge: &mut Charge,
        peer: Option<&PeerShare>,
        bytes: usize,
    ) -> Result<(), Status> {
        self.grow_leaving(charge, peer, bytes, 0)
    }

    /// [`grow`](Self::grow), charging at most what leaves `room` bytes of the budget (or
    /// share): for what a response holds beside its messages, which are charged apart.
    pub(crate) fn grow_leaving(
        &self,
        charge: &mut Charge,
        peer: Option<&PeerShare>,
        bytes: usize,
        room: usize,
    ) -> Result<(), Status> {
        // A share as large as the budget is no share.
        let peer = peer.filter(|_| self.per_peer_units < self.total_units);
        let room = u32::try_from(room.div_ceil(UNIT)).unwrap_or(u32::MAX);
        let mut units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .min(self.total_units.saturating_sub(room));
        if peer.is_some() {
            units = units.min(self.per_peer_units.saturating_sub(room));
        }
        let Some(more) = units.checked_sub(charge.units).filter(|&n| n > 0) else {
            return Ok(());
        };
        let peer_more = match peer {
            Some(PeerShare(share)) => Some(
                share
                    .clone()
                    .try_acquire_many_owned(more)
                    .map_err(|_| self.exhausted(true))?,
            ),
            None => None,
        };
        let all_more = self
            .all
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| self.exhausted(false))?;
        merge(&mut charge.all, all_more);
        if let Some(peer_more) = peer_more {
            merge(&mut charge.peer, peer_more);
        }
        charge.units = units;
        Ok(())
    }

    fn exhausted(&self, peer: bool) -> Status {
        let mib = |units: u32| units as usize * UNIT / (1024 * 1024);
        let held_by = if peer {
            format!(
                "this client address's share of the server's memory for responses waiting to be \
                 read ({} MiB, --response-budget-per-ip-mb) is in use by its other calls",
                mib(self.per_peer_units)
            )
        } else {
            format!(
                "the server's memory for responses waiting to be read ({} MiB, \
                 --response-budget-mb) is in use by other clients",
                mib(self.total_units)
            )
        };
        Status::resource_exhausted(format!(
            "{held_by}; retry later (a feed or query resumes from its last continuation)"
        ))
    }

    #[cfg(test)]
    pub(crate) fn available_units(&self) -> usize {
        self.all.available_permits()
    }
}

fn merge(held: &mut Option<OwnedSemaphorePermit>, more: OwnedSemaphorePermit) {
    match held {
        Some(held) => held.merge(more),
        None => *held = Some(more),
    }
}

/// The memory for request messages on their way in: each is charged its declared length from
/// its first bytes until its call has read it.
#[derive(Debug, Clone)]
pub(crate) struct RequestBudget {
    all: Arc<Semaphore>,
    total_units: u32,
}

impl RequestBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        let total_units = u32::try_from(bytes / UNIT).unwrap_or(u32::MAX);
        RequestBudget {
            all: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
        }
    }

    /// Takes `bytes` more of the budget into `held`, or says why not.
    pub(crate) fn take(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), Status> {
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .min(self.total_units);
        if units == 0 {
            return Ok(());
        }
        let more = self
            .all
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| {
                Status::resource_exhausted(format!(
                    "the server's memory for request messages on their way in ({} MiB, \
                     --request-budget-mb) is in use by other calls; retry later",
                    self.total_units as usize * UNIT / (1024 * 1024)
                ))
            })?;
        merge(held, more);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_address_is_held_to_its_share_and_all_to_the_budget() {
        let budget = ResponseBudget::new(100 * UNIT, 40 * UNIT);
        let (a, b) = (budget.peer_share(), budget.peer_share());
        let mut first = Charge::default();
        budget.grow(&mut first, Some(&a), 30 * UNIT).expect("fits");
        // Growing is charged the difference only.
        budget.grow(&mut first, Some(&a), 35 * UNIT).expect("fits");
        assert_eq!(budget.available_units(), 65);
        let mut second = Charge::default();
        let refused = budget
            .grow(&mut second, Some(&a), 10 * UNIT)
            .expect_err("past the share");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("--response-budget-per-ip-mb"));
        assert_eq!(budget.available_units(), 65, "a refusal takes nothing");
        // Another address has its own share; the budget bounds them all.
        let mut third = Charge::default();
        budget.grow(&mut third, Some(&b), 40 * UNIT).expect("fits");
        let mut fourth = Charge::default();
        let refused = budget
            .grow(&mut fourth, None, 30 * UNIT)
            .expect_err("past the budget");
        assert!(refused.message().contains("--response-budget-mb"));
        drop((first, third));
        assert_eq!(budget.available_units(), 100);
        // A response larger than a share is charged the whole share, so it can be sent.
        budget
            .grow(&mut fourth, Some(&a), 1000 * UNIT)
            .expect("alone");
        assert_eq!(budget.available_units(), 60);
    }

    #[test]
    fn requests_take_their_declared_length() {
        let budget = RequestBudget::new(10 * UNIT);
        let mut held = None;
        budget.take(&mut held, 6 * UNIT).expect("fits");
        let mut other = None;
        let refused = budget.take(&mut other, 5 * UNIT).expect_err("past it");
        assert!(refused.message().contains("--request-budget-mb"));
        drop(held);
        budget.take(&mut other, 5 * UNIT).expect("freed");
    }
}
