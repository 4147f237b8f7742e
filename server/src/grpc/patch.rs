//! `Documents.PatchDocument`'s operations, condition and options, converted from the proto (a
//! batch's patch operations use the same conversions).

use std::sync::Arc;

use mayfly_proto::{
    json::{JsonDefect, JsonObject},
    v1::{
        self, PatchIncrement, PatchMove, PatchValue,
        oneofs::{PatchIncrementBy, PatchOp as ProtoOp},
    },
};
use serde_json::Number;
use tonic::metadata::AsciiMetadataValue;

use super::convert;
use crate::engine::{
    Error, InvalidInput, MAX_PATCH_OPERATIONS, PatchCondition, PatchOp, PatchOptions,
};
use crate::model::Echo;

/// Response header of `PatchDocument`: `true` if the patch created its document from its
/// `create_if_missing` body, `false` if it patched a live one. (The response message is the
/// document itself, which has no room for it.)
pub(super) const CREATED_HEADER: &str = "mayfly-created";

/// The value of [`CREATED_HEADER`].
pub(super) fn created_value(created: bool) -> AsciiMetadataValue {
    AsciiMetadataValue::from_static(if created { "true" } else { "false" })
}

/// A request's `create_if_missing` and `create_parents`. The body is checked as a create's is
/// (its failures named as this body's); its id and partition key are checked by the engine.
pub(super) fn options(
    create_if_missing: Option<JsonObject>,
    create_parents: bool,
) -> Result<PatchOptions, InvalidInput> {
    let create_if_missing = create_if_missing
        .map(|body| convert::document_body(Some(body), None))
        .transpose()
        .map_err(|e| InvalidInput::CreateIfMissing(Box::new(e)))?;
    Ok(PatchOptions {
        create_if_missing,
        create_parents,
    })
}

/// A request's patch operations; the count is checked before any is converted.
pub(super) fn operations(ops: Vec<v1::PatchOperation>) -> Result<Vec<PatchOp>, InvalidInput> {
    if ops.is_empty() || ops.len() > MAX_PATCH_OPERATIONS {
        return Err(InvalidInput::PatchSize {
            count: ops.len(),
            max: MAX_PATCH_OPERATIONS,
        });
    }
    ops.into_iter()
        .enumerate()
        .map(|(index, op)| operation(index, op))
        .collect()
}

fn operation(index: usize, op: v1::PatchOperation) -> Result<PatchOp, InvalidInput> {
    let bad = |op: &'static str, path: &str, reason: &str| InvalidInput::Patch {
        index,
        op,
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let value = |op: &'static str, PatchValue { path, value }: PatchValue| {
        let Some(value) = value else {
            return Err(bad(op, &path, "it needs a value"));
        };
        match value.into_checked() {
            Ok(value) => Ok((path, value)),
            // The one reason every JSON field nested too deep gets.
            Err(defect @ JsonDefect::TooDeep) => Err(convert::value_defect(
                format!(
                    "the value of patch operation {index} ({op} {})",
                    Echo(&path)
                ),
                defect,
            )),
            Err(defect) => Err(bad(op, &path, &defect.to_string())),
        }
    };
    Ok(match op.op {
        None => {
            return Err(bad(
                "unset",
                "",
                "set exactly one of add, set, replace, remove, incr or move",
            ));
        }
        Some(ProtoOp::Add(v)) => {
            let (path, value) = value("add", v)?;
            PatchOp::Add { path, value }
        }
        Some(ProtoOp::Set(v)) => {
            let (path, value) = value("set", v)?;
            PatchOp::Set { path, value }
        }
        Some(ProtoOp::Replace(v)) => {
            let (path, value) = value("replace", v)?;
            PatchOp::Replace { path, value }
        }
        Some(ProtoOp::Remove(path)) => PatchOp::Remove { path },
        Some(ProtoOp::Incr(PatchIncrement { path, by })) => {
            let by = match by {
                Some(PatchIncrementBy::Integer(n)) => Number::from(n),
                Some(PatchIncrementBy::Number(x)) => match Number::from_f64(x) {
                    Some(n) => n,
                    None => return Err(bad("incr", &path, "the number is NaN or infinite")),
                },
                None => return Err(bad("incr", &path, "set one of integer or number")),
            };
            PatchOp::Incr { path, by }
        }
        Some(ProtoOp::Move(PatchMove { from, path })) => PatchOp::Move { from, path },
    })
}

/// A request's condition (`None` if empty).
pub(super) fn condition(text: &str) -> Result<Option<Arc<PatchCondition>>, Error> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    PatchCondition::parse(text).map(|c| Some(Arc::new(c)))
}
