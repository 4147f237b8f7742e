//! Patch operations as the API carries them, for the tests that send patches.

use mayfly_proto::{
    json::JsonValue,
    v1::{
        PatchIncrement, PatchOperation, PatchValue,
        oneofs::{PatchIncrementBy, PatchOp},
    },
};
use serde_json::Value;

/// `incr` of `path` by the integer `by`.
pub(crate) fn incr(path: &str, by: i64) -> PatchOperation {
    PatchOperation {
        op: Some(PatchOp::Incr(PatchIncrement {
            path: path.into(),
            by: Some(PatchIncrementBy::Integer(by)),
        })),
    }
}

/// `set` of `path` to `value`.
pub(crate) fn set(path: &str, value: Value) -> PatchOperation {
    PatchOperation {
        op: Some(PatchOp::Set(PatchValue {
            path: path.into(),
            value: Some(JsonValue::new(value)),
        })),
    }
}
