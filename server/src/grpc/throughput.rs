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
    /// Admits a request on `path`'s collection by its provisioned throughput: `None` where it
    /// has none (or is not there: the engine answers that), else what to charge once done.
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
        let Some(throughput) = info.settings.throughput() else {
            return Ok(None);
        };
        let now = self.limiter.now_ms();
        match self.limiter.admit(info.uid, throughput, now) {
            Ok(admitted) => Ok(Some(admitted)),
            Err(wait) => Err((
                charged_status(
                    to_status(engine::Error::RequestRateTooLarge {
                        budget: format!("collection {}/{}", info.database, info.id),
                        limit: throughput.limit(),
                        retry_after_ms: wait.as_millis() as u64,
                    }),
                    RequestCharge::ZERO,
                ),
                wait,
            )),
        }
    }
}
