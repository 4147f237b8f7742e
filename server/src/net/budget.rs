//! Memory budgets for what clients make the server hold: responses waiting to be read and
//! request messages on their way in. Each is shared by all clients, with a share per client
//! address so that one client cannot take it all.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use super::Limits;

/// Budgets count kibibytes, so that a `u32` of permits covers any response.
pub(crate) const UNIT: usize = 1024;

/// What the messages of the services that need no key (health, reflection) may hold on their
/// way in, all together: apart from `--request-budget-mb`, so that callers without a key
/// cannot take the budget of those with one.
const OPEN_REQUEST_BUDGET: usize = 16 * 1024 * 1024;

/// What the streaming responses of the services that need no key (reflection) may hold while
/// their readers stall, all together: apart from `--response-budget-mb` for the same reason.
const OPEN_RESPONSE_BUDGET: usize = 16 * 1024 * 1024;

/// Every budget of a server, made once from its limits.
#[derive(Debug, Clone)]
pub(crate) struct Budgets {
    pub(crate) responses: ResponseBudget,
    pub(crate) requests: RequestBudget,
    /// For the services that need no key (health, reflection), whose messages are small.
    pub(crate) open_requests: RequestBudget,
    /// For the streaming responses of those services.
    pub(crate) open_responses: ResponseBudget,
}

/// One client address's share of each of the [`Budgets`].
#[derive(Debug, Clone)]
pub(crate) struct PeerShares {
    pub(crate) responses: PeerShare,
    pub(crate) requests: PeerShare,
    pub(crate) open_requests: PeerShare,
    pub(crate) open_responses: PeerShare,
}

impl Budgets {
    pub(crate) fn new(limits: &Limits) -> Self {
        Budgets {
            responses: ResponseBudget::new(
                limits.response_budget_bytes,
                limits.response_budget_per_ip_bytes,
            ),
            requests: RequestBudget::new(
                limits.request_budget_bytes,
                limits.request_budget_per_ip_bytes,
            ),
            open_requests: RequestBudget::open(OPEN_REQUEST_BUDGET, OPEN_REQUEST_BUDGET / 4),
            open_responses: ResponseBudget::open(OPEN_RESPONSE_BUDGET, OPEN_RESPONSE_BUDGET / 4),
        }
    }

    /// A new client address's shares.
    pub(crate) fn peer_shares(&self) -> PeerShares {
        PeerShares {
            responses: self.responses.peer_share(),
            requests: self.requests.shared.peer_share(),
            open_requests: self.open_requests.shared.peer_share(),
            open_responses: self.open_responses.peer_share(),
        }
    }
}

/// One client address's share of a budget.
#[derive(Debug, Clone)]
pub struct PeerShare(Arc<Semaphore>);

/// What one response or request holds of a budget, given back when dropped.
#[derive(Debug, Default)]
pub(crate) struct Charge {
    all: Option<OwnedSemaphorePermit>,
    peer: Option<OwnedSemaphorePermit>,
    units: u32,
}

/// How a budget's refusals name it.
#[derive(Debug, Clone, Copy)]
struct Names {
    /// What the memory is for.
    what: &'static str,
    /// The flags that set the whole and the share, if any do.
    flags: Option<(&'static str, &'static str)>,
}

/// A budget shared by all clients, with a share per client address: what the response and
/// request budgets both are.
#[derive(Debug, Clone)]
struct Shared {
    all: Arc<Semaphore>,
    total_units: u32,
    per_peer_units: u32,
    names: Names,
}

/// Which part of a budget has not enough free.
#[derive(Debug, Clone, Copy)]
enum Short {
    Share,
    All,
}

impl Shared {
    /// `bytes` for all clients, `per_peer_bytes` of it for one client address.
    fn new(bytes: usize, per_peer_bytes: usize, names: Names) -> Self {
        let units = |b: usize| u32::try_from(b / UNIT).unwrap_or(u32::MAX);
        let total_units = units(bytes);
        Shared {
            all: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
            per_peer_units: units(per_peer_bytes).min(total_units),
            names,
        }
    }

    fn peer_share(&self) -> PeerShare {
        PeerShare(Arc::new(Semaphore::new(self.per_peer_units as usize)))
    }

    /// The share to charge besides the whole: a share as large as the budget is no share.
    fn share<'a>(&self, peer: Option<&'a PeerShare>) -> Option<&'a PeerShare> {
        peer.filter(|_| self.per_peer_units < self.total_units)
    }

    /// The most one charge may hold (with `share` as [`Shared::share`] gave it), so that none
    /// is refused forever.
    fn most(&self, share: Option<&PeerShare>) -> u32 {
        match share {
            Some(_) => self.per_peer_units,
            None => self.total_units,
        }
    }

    /// Adds `more` units to `charge`, from `share` (as [`Shared::share`] gave it) and the
    /// whole; leaves it as it was if either has not that much free.
    fn add(&self, charge: &mut Charge, share: Option<&PeerShare>, more: u32) -> Result<(), Short> {
        let peer_more = match share {
            Some(PeerShare(share)) => Some(
                share
                    .clone()
                    .try_acquire_many_owned(more)
                    .map_err(|_| Short::Share)?,
            ),
            None => None,
        };
        let all_more = self
            .all
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| Short::All)?;
        merge(&mut charge.all, all_more);
        if let Some(peer_more) = peer_more {
            merge(&mut charge.peer, peer_more);
        }
        charge.units = charge.units.saturating_add(more);
        Ok(())
    }

    /// RESOURCE_EXHAUSTED, saying which part was short, then `then`.
    fn exhausted(&self, short: Short, then: &str) -> Status {
        let mib = |units: u32| units as usize * UNIT / (1024 * 1024);
        let Names { what, flags } = self.names;
        let flag = |name: fn((&'static str, &'static str)) -> &'static str| {
            flags.map(|f| format!(", {}", name(f))).unwrap_or_default()
        };
        let held_by = match short {
            Short::Share => format!(
                "this client address's share of the server's memory for {what} ({} MiB{}) is \
                 in use by its other calls",
                mib(self.per_peer_units),
                flag(|f| f.1)
            ),
            Short::All => format!(
                "the server's memory for {what} ({} MiB{}) is in use by other clients",
                mib(self.total_units),
                flag(|f| f.0)
            ),
        };
        Status::resource_exhausted(format!("{held_by}; {then}"))
    }
}

/// The memory for responses waiting to be read.
#[derive(Debug, Clone)]
pub struct ResponseBudget {
    shared: Shared,
}

impl ResponseBudget {
    /// `bytes` for all clients, `per_peer_bytes` of it for one client address.
    pub fn new(bytes: usize, per_peer_bytes: usize) -> Self {
        ResponseBudget {
            shared: Shared::new(
                bytes,
                per_peer_bytes,
                Names {
                    what: "responses waiting to be read",
                    flags: Some(("--response-budget-mb", "--response-budget-per-ip-mb")),
                },
            ),
        }
    }

    /// The budget of the services that need no key, which no flag sets.
    fn open(bytes: usize, per_peer_bytes: usize) -> Self {
        let what = "reflection responses waiting to be read";
        let names = Names { what, flags: None };
        ResponseBudget {
            shared: Shared::new(bytes, per_peer_bytes, names),
        }
    }

    /// A new client address's share.
    pub fn peer_share(&self) -> PeerShare {
        self.shared.peer_share()
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
        let share = self.shared.share(peer);
        let units = units(bytes).min(self.shared.most(share).saturating_sub(units(room)));
        let Some(more) = units.checked_sub(charge.units).filter(|&n| n > 0) else {
            return Ok(());
        };
        self.shared.add(charge, share, more).map_err(|short| {
            self.shared.exhausted(
                short,
                "retry later (a feed or query resumes from its last continuation)",
            )
        })
    }

    /// [`grow`](Self::grow) for memory about to be used (a page being built), which may
    /// stop short: refused as well past what one charge may hold, so that a page never holds
    /// more than it reserved.
    pub(crate) fn reserve(
        &self,
        charge: &mut Charge,
        peer: Option<&PeerShare>,
        bytes: usize,
    ) -> Result<(), Status> {
        let share = self.shared.share(peer);
        if units(bytes) > self.shared.most(share) {
            let short = if share.is_some() {
                Short::Share
            } else {
                Short::All
            };
            return Err(self.shared.exhausted(
                short,
                "retry later (a feed or query resumes from its last continuation)",
            ));
        }
        self.grow(charge, peer, bytes)
    }

    #[cfg(test)]
    pub(crate) fn available_units(&self) -> usize {
        self.shared.all.available_permits()
    }
}

/// The units that cover `bytes`.
fn units(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX)
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
    shared: Shared,
}

impl RequestBudget {
    /// `bytes` for all clients, `per_peer_bytes` of it for one client address.
    pub(crate) fn new(bytes: usize, per_peer_bytes: usize) -> Self {
        RequestBudget {
            shared: Shared::new(
                bytes,
                per_peer_bytes,
                Names {
                    what: "request messages on their way in",
                    flags: Some(("--request-budget-mb", "--request-budget-per-ip-mb")),
                },
            ),
        }
    }

    /// The budget of the services that need no key, which no flag sets.
    fn open(bytes: usize, per_peer_bytes: usize) -> Self {
        let what = "health and reflection request messages on their way in";
        let names = Names { what, flags: None };
        RequestBudget {
            shared: Shared::new(bytes, per_peer_bytes, names),
        }
    }

    /// Takes `bytes` more of the budget (and of `peer`'s share of it) into `charge`, or says
    /// why not. One message may always have the whole of either.
    pub(crate) fn take(
        &self,
        charge: &mut Charge,
        peer: Option<&PeerShare>,
        bytes: usize,
    ) -> Result<(), Status> {
        let share = self.shared.share(peer);
        let units = units(bytes).min(self.shared.most(share));
        if units == 0 {
            return Ok(());
        }
        self.shared
            .add(charge, share, units)
            .map_err(|short| self.shared.exhausted(short, "retry later"))
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
        let budget = RequestBudget::new(10 * UNIT, 10 * UNIT);
        let mut held = Charge::default();
        budget.take(&mut held, None, 6 * UNIT).expect("fits");
        let mut other = Charge::default();
        let refused = budget
            .take(&mut other, None, 5 * UNIT)
            .expect_err("past it");
        assert!(refused.message().contains("--request-budget-mb"));
        drop(held);
        budget.take(&mut other, None, 5 * UNIT).expect("freed");
    }

    /// Issue 23, finding 8: one address's stalled uploads filled the request budget, and every
    /// other client's calls were refused.
    #[test]
    fn one_client_address_takes_at_most_its_share_of_the_request_budget() {
        let budget = RequestBudget::new(64 * UNIT, 32 * UNIT);
        let (a, b) = (budget.shared.peer_share(), budget.shared.peer_share());
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut charge = Charge::default();
            budget.take(&mut charge, Some(&a), 16 * UNIT).expect("fits");
            held.push(charge);
        }
        let mut refused = Charge::default();
        let status = budget
            .take(&mut refused, Some(&a), UNIT)
            .expect_err("past its share");
        assert!(status.message().contains("--request-budget-per-ip-mb"));
        // The rest is the other addresses'.
        for _ in 0..2 {
            let mut charge = Charge::default();
            budget.take(&mut charge, Some(&b), 16 * UNIT).expect("fits");
            held.push(charge);
        }
        drop(held);
        // One message larger than a share is charged the whole share, so it can be read.
        let mut large = Charge::default();
        budget
            .take(&mut large, Some(&a), 100 * UNIT)
            .expect("alone");
        assert_eq!(budget.shared.all.available_permits(), 32);
    }
}
