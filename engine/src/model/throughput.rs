//! Provisioned throughput (README, "Request units"): what a collection, or a database shared
//! by its collections, may spend per second, in request units. Manual, or autoscale between
//! 10 % and 100 % of a maximum, with Azure Cosmos DB's bounds and steps. None means unlimited.

use super::InvalidInput;

/// The least manual throughput, and its step (RU/s), as Cosmos DB has them.
pub const MIN_MANUAL_THROUGHPUT: u32 = 400;
const MANUAL_STEP: u32 = 100;
/// The least autoscale maximum, and its step (RU/s), as Cosmos DB has them.
pub const MIN_AUTOSCALE_MAX_THROUGHPUT: u32 = 1_000;
const AUTOSCALE_STEP: u32 = 1_000;
/// The most either may be (RU/s): past it, a value is a mistake, not a plan.
pub const MAX_THROUGHPUT: u32 = 1_000_000;

/// A provisioned throughput.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Throughput {
    /// This many RU/s, every second.
    Manual { ru_per_second: u32 },
    /// Scales between a tenth of `max_ru_per_second` and all of it, as used.
    Autoscale { max_ru_per_second: u32 },
}

impl Throughput {
    /// Manual throughput from a request's `value` (field `field`): a whole number of RU/s,
    /// at least 400, in steps of 100, at most 1,000,000.
    pub fn manual(field: &'static str, value: f64) -> Result<Self, InvalidInput> {
        let ru = whole(field, value, MIN_MANUAL_THROUGHPUT, MANUAL_STEP)?;
        Ok(Throughput::Manual { ru_per_second: ru })
    }

    /// Autoscale from a request's maximum `value` (field `field`): a whole number of RU/s, at
    /// least 1,000, in steps of 1,000, at most 1,000,000.
    pub fn autoscale(field: &'static str, value: f64) -> Result<Self, InvalidInput> {
        let ru = whole(field, value, MIN_AUTOSCALE_MAX_THROUGHPUT, AUTOSCALE_STEP)?;
        Ok(Throughput::Autoscale {
            max_ru_per_second: ru,
        })
    }

    /// The rate enforced (RU/s): the manual rate, or the autoscale maximum (autoscale follows
    /// the load at once, up to its maximum).
    pub fn limit(self) -> u32 {
        match self {
            Throughput::Manual { ru_per_second } => ru_per_second,
            Throughput::Autoscale { max_ru_per_second } => max_ru_per_second,
        }
    }

    /// The least it provisions (RU/s): the manual rate, or a tenth of the autoscale maximum.
    pub fn floor(self) -> u32 {
        match self {
            Throughput::Manual { ru_per_second } => ru_per_second,
            Throughput::Autoscale { max_ru_per_second } => max_ru_per_second / 10,
        }
    }
}

fn whole(field: &'static str, value: f64, min: u32, step: u32) -> Result<u32, InvalidInput> {
    let refused = |rule: String| InvalidInput::Throughput {
        field,
        value: value.to_string(),
        rule,
    };
    if !value.is_finite() || value.fract() != 0.0 {
        return Err(refused("a whole number of request units per second".into()));
    }
    if value < f64::from(min) || value > f64::from(MAX_THROUGHPUT) {
        return Err(refused(format!(
            "at least {min} and at most {MAX_THROUGHPUT} request units per second"
        )));
    }
    let ru = value as u32;
    if !ru.is_multiple_of(step) {
        return Err(refused(format!("a multiple of {step}")));
    }
    Ok(ru)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_takes_cosmos_bounds_and_steps() {
        assert_eq!(
            Throughput::manual("t", 1_000.0),
            Ok(Throughput::Manual {
                ru_per_second: 1_000
            })
        );
        let auto = Throughput::autoscale("t", 20_000.0).expect("valid");
        assert_eq!((auto.limit(), auto.floor()), (20_000, 2_000));
        let manual = Throughput::manual("t", 400.0).expect("valid");
        assert_eq!((manual.limit(), manual.floor()), (400, 400));
    }

    #[test]
    fn bad_throughput_is_refused_naming_its_field() {
        for bad in [
            -400.0,
            0.0,
            399.0,
            450.0,
            1_000.5,
            2e9,
            f64::NAN,
            f64::INFINITY,
        ] {
            let e = Throughput::manual("throughput.manual", bad).expect_err("refused");
            assert!(e.to_string().contains("throughput.manual"), "{bad}: {e}");
        }
        for bad in [400.0, 999.0, 1_500.0, 0.0, -1_000.0] {
            let e = Throughput::autoscale("throughput.autoscale_max", bad).expect_err("refused");
            assert!(
                e.to_string().contains("throughput.autoscale_max"),
                "{bad}: {e}"
            );
        }
    }
}
