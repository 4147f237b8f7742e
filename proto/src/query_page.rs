//! `mayfly.v1.QueryPage` on the wire, JSON results in memory.
//!
//! Results travel as `google.protobuf.Value`, so grpcurl shows them as JSON. Generated code
//! would hold each result as a `prost_types::Value` tree: the server would rebuild every result
//! from its JSON before encoding it, and a client would rebuild JSON from the tree. This type
//! encodes JSON results straight to the wire and decodes them straight into JSON, with the
//! document depth limit of [`crate::json`] (a result nested deeper fails to decode with a
//! message saying so, rather than prost's recursion limit at ~33 levels).

use prost::{
    DecodeError,
    bytes::{Buf, BufMut},
    encoding::{self, DecodeContext, WireType},
};
use serde_json::Value;

use crate::{generated::QueryMetrics, json};

const RESULTS: u32 = 1;
const CONTINUATION: u32 = 2;
const METRICS: u32 = 3;
const REQUEST_CHARGE: u32 = 4;

/// One page of query results (see `proto/mayfly/v1/document.proto`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueryPage {
    /// Results: documents (with `_ts` and `_etag`) or any JSON value (`SELECT VALUE 1`).
    pub results: Vec<Value>,
    /// Token to resume after this page; empty on the last page.
    pub continuation: String,
    /// What producing this page took.
    pub metrics: Option<QueryMetrics>,
    /// What this page cost, in request units.
    pub request_charge: f64,
}

impl prost::Message for QueryPage {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for result in &self.results {
            json::encode_value_field(RESULTS, result, buf);
        }
        if !self.continuation.is_empty() {
            encoding::string::encode(CONTINUATION, &self.continuation, buf);
        }
        if let Some(metrics) = &self.metrics {
            encoding::message::encode(METRICS, metrics, buf);
        }
        if self.request_charge != 0.0 {
            encoding::double::encode(REQUEST_CHARGE, &self.request_charge, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            RESULTS => {
                let result = json::decode_value_field(wire_type, buf).map_err(|mut e| {
                    e.push("QueryPage", "results");
                    e
                })?;
                self.results.push(result);
                Ok(())
            }
            CONTINUATION => encoding::string::merge(wire_type, &mut self.continuation, buf, ctx),
            METRICS => encoding::message::merge(
                wire_type,
                self.metrics.get_or_insert_with(QueryMetrics::default),
                buf,
                ctx,
            ),
            REQUEST_CHARGE => {
                encoding::double::merge(wire_type, &mut self.request_charge, buf, ctx)
            }
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let results: usize = self
            .results
            .iter()
            .map(|r| json::value_field_len(RESULTS, r))
            .sum();
        let continuation = if self.continuation.is_empty() {
            0
        } else {
            encoding::string::encoded_len(CONTINUATION, &self.continuation)
        };
        let metrics = self
            .metrics
            .as_ref()
            .map_or(0, |m| encoding::message::encoded_len(METRICS, m));
        let charge = if self.request_charge == 0.0 {
            0
        } else {
            encoding::double::encoded_len(REQUEST_CHARGE, &self.request_charge)
        };
        results + continuation + metrics + charge
    }

    fn clear(&mut self) {
        *self = QueryPage::default();
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use serde_json::json;

    use super::*;

    /// What generated code (prost_types) makes of the same page: the wire format is the one
    /// `document.proto` declares.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(message, repeated, tag = "1")]
        results: Vec<prost_types::Value>,
        #[prost(string, tag = "2")]
        continuation: String,
        #[prost(message, optional, tag = "3")]
        metrics: Option<QueryMetrics>,
        #[prost(double, tag = "4")]
        request_charge: f64,
    }

    fn sample() -> QueryPage {
        QueryPage {
            results: vec![
                json!({"id": "a", "n": 1, "tags": ["x", null, true], "deep": {"k": 2.5}}),
                json!(7),
                json!("text"),
                json!(null),
                json!([]),
                json!({}),
            ],
            continuation: "token".into(),
            metrics: Some(QueryMetrics {
                documents_examined: 3,
                index_entries_examined: 4,
                results_returned: 6,
                index_used: true,
                index: "/n/?".into(),
            }),
            request_charge: 3.27,
        }
    }

    #[test]
    fn encodes_as_generated_code_does_and_decodes_back() {
        let page = sample();
        let bytes = page.encode_to_vec();
        assert_eq!(bytes.len(), page.encoded_len());
        let theirs = Generated {
            results: page.results.iter().map(json::to_proto_value).collect(),
            continuation: page.continuation.clone(),
            metrics: page.metrics.clone(),
            request_charge: page.request_charge,
        };
        assert_eq!(Generated::decode(&bytes[..]).expect("decodes"), theirs);
        assert_eq!(
            QueryPage::decode(&theirs.encode_to_vec()[..]).expect("decodes"),
            page
        );
        assert_eq!(QueryPage::decode(&bytes[..]).expect("decodes"), page);
        assert_eq!(QueryPage::default().encode_to_vec(), Vec::<u8>::new());
    }

    #[test]
    fn a_result_deeper_than_the_limit_fails_to_decode_and_says_why() {
        let mut deep = json!(1);
        for _ in 0..json::MAX_DEPTH + 1 {
            deep = json!([deep]);
        }
        let page = QueryPage {
            results: vec![deep],
            ..QueryPage::default()
        };
        let err = QueryPage::decode(&page.encode_to_vec()[..]).expect_err("too deep");
        assert!(err.to_string().contains("nested deeper than 128"), "{err}");
        let mut ok = json!(1);
        for _ in 0..json::MAX_DEPTH {
            ok = json!([ok]);
        }
        let page = QueryPage {
            results: vec![ok],
            ..QueryPage::default()
        };
        assert_eq!(
            QueryPage::decode(&page.encode_to_vec()[..]).expect("fits"),
            page
        );
    }

    #[test]
    fn truncated_bytes_fail_to_decode() {
        let bytes = sample().encode_to_vec();
        // Each cut falls inside a field.
        for cut in [1, 5, bytes.len() - 1] {
            assert!(QueryPage::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
