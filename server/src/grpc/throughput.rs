//! Provisioned throughput at the edge (README, "Request units"): a document request on a
//! collection with a throughput is admitted by its budget before the engine is asked
//! anything (no shard lock, fsync slot or blocking thread is taken by a refused one), and
//! charged what it cost once answered.

use std::time::Duration;

use tonic::Status;

use super::{DocumentsService, request_charge::charged_status, status::to_status};
use crate::{
    engine::{self, CollectionPath, RequestCharge},
    throughput_limit::Admitted,
};

impl DocumentsService {
    /// Admits a request on `path`'s collection by its provisioned throughput (its own, or its
    /// database's shared one): `None` where the collection is not there (the engine answers
    /// that), else what to charge once done (to its budget, if any, and its usage).
    /// Refused `RESOURCE_EXHAUSTED` / `REQUEST_RATE_TOO_LARGE` with the delay until the
    /// budget has credit again; nothing is changed.
    pub(super) fn admit(
        &self,
        engine: &engine::Engine,
        path: &CollectionPath,
    ) -> Result<Option<Admitted>, Status> {
        self.admission(engine, path).map_err(|(status, _)| status)
    }

    /// [`Self::admit`], with the delay of a refusal beside its status (a stream waits it out).
    pub(super) fn admission(
        &self,
        engine: &engine::Engine,
        path: &CollectionPath,
    ) -> Result<Option<Admitted>, (Status, Duration)> {
        let Ok(info) = engine.get_collection(path) else {
            return Ok(None);
        };
        let budget = engine.budget(&info);
        let live = || engine.collection_uids();
        match self.limiter.admit(info.uid, budget, live) {
            Ok(admitted) => Ok(Some(admitted)),
            Err(wait) => Err((
                charged_status(
                    to_status(engine::Error::RequestRateTooLarge {
                        budget: match budget {
                            Some((engine::Budget::Database(_), _)) => {
                                format!("database {} (shared by its collections)", info.database)
                            }
                            _ => format!("collection {}/{}", info.database, info.id),
                        },
                        limit: budget.map_or(0, |(_, t)| t.limit()),
                        retry_after_ms: wait.as_millis() as u64,
                    }),
                    RequestCharge::ZERO,
                ),
                wait,
            )),
        }
    }
}
