//! Request charges on the wire (README, "Request units"): every unary answer, success or
//! failure, carries its charge in the `x-request-charge` header (as Cosmos DB's
//! `x-ms-request-charge`), and every streamed page in its message's `request_charge` field.
//! A request refused before it reached the data (bad input, no access) costs nothing.

use tonic::{Response, Status, metadata::MetadataValue};

use crate::engine::RequestCharge;

/// The header a unary answer's charge travels in.
pub(crate) const HEADER: &str = "x-request-charge";

fn value(charge: RequestCharge) -> MetadataValue<tonic::metadata::Ascii> {
    MetadataValue::try_from(charge.to_string()).expect("digits and a dot are a valid header")
}

/// `response`, saying it cost `charge`.
pub(super) fn charged<T>(mut response: Response<T>, charge: RequestCharge) -> Response<T> {
    response.metadata_mut().insert(HEADER, value(charge));
    response
}

/// `status`, saying the request it answers cost `charge`.
pub(super) fn charged_status(mut status: Status, charge: RequestCharge) -> Status {
    status.metadata_mut().insert(HEADER, value(charge));
    status
}

/// A page of a query or read feed: its metrics, and its results' size as JSON.
pub(super) fn page(
    index_entries: u64,
    documents: u64,
    results: &[serde_json::Value],
) -> RequestCharge {
    let bytes = results
        .iter()
        .map(mayfly_query::value::approximate_size)
        .sum();
    RequestCharge::page(index_entries, documents, bytes)
}

/// An answer about databases, collections or keys: a flat charge (no documents read).
pub(super) fn metadata_response<T>(message: T) -> Response<T> {
    charged(Response::new(message), RequestCharge::metadata())
}

/// Two charges as the wire carries them (units, two decimals), summed exactly: a page or a
/// change feed batch put together from several nodes' costs what each part cost.
pub(super) fn sum_units(a: f64, b: f64) -> f64 {
    (RequestCharge::from_units(a) + RequestCharge::from_units(b)).units()
}
