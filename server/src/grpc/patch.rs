//! `Documents.PatchDocument`'s operations and condition, converted from the proto (a batch's
//! patch operations use the same conversions).

use std::sync::Arc;

use mayfly_proto::{
    json::JsonDefect,
    v1::{
        self, PatchIncrement, PatchMove, PatchValue,
        oneofs::{PatchIncrementBy, PatchOp as ProtoOp},
    },
};
use serde_json::Number;

use super::convert;
use crate::engine::{Error, InvalidInput, MAX_PATCH_OPERATIONS, PatchCondition, PatchOp};
use crate::model::Echo;

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
