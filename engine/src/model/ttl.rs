//! The TTL rules of Cosmos DB (SPEC §2-4): settings, their validation and when a document
//! expires. Pure functions; the engine applies them with one clock reading per request.

use std::{fmt, num::NonZeroU32};

use serde_json::Value;

use super::{Millis, invalid::InvalidInput};

/// Largest TTL in seconds (int32 max, as in Cosmos DB).
pub const MAX_TTL_SECONDS: u32 = i32::MAX as u32;

/// A TTL in whole seconds, 1..=2,147,483,647.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TtlSeconds(NonZeroU32);

impl TtlSeconds {
    /// `seconds` if it is in range.
    pub fn new(seconds: i64) -> Option<Self> {
        u32::try_from(seconds)
            .ok()
            .filter(|s| *s <= MAX_TTL_SECONDS)
            .and_then(NonZeroU32::new)
            .map(TtlSeconds)
    }

    /// The number of seconds.
    pub fn get(self) -> u32 {
        self.0.get()
    }

    /// The TTL in milliseconds.
    pub(crate) fn millis(self) -> Millis {
        Millis::from(self.get()) * 1_000
    }
}

/// A collection's default TTL (`defaultTtl`): the three states of SPEC §2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DefaultTtl {
    /// Absent: nothing in the collection expires, not even documents with their own `ttl`.
    #[default]
    Off,
    /// `-1`: on, documents do not expire unless they carry their own `ttl`.
    NoDefault,
    /// `n`: documents expire `n` seconds after their last write unless they override it.
    After(TtlSeconds),
}

impl DefaultTtl {
    /// Validates a request's `defaultTtl` (absent = off).
    pub fn from_raw(raw: Option<i64>) -> Result<Self, InvalidInput> {
        match raw {
            None => Ok(DefaultTtl::Off),
            Some(-1) => Ok(DefaultTtl::NoDefault),
            Some(n) => TtlSeconds::new(n)
                .map(DefaultTtl::After)
                .ok_or(InvalidInput::DefaultTtl { raw: n.to_string() }),
        }
    }

    /// The Cosmos representation: absent, -1 or n.
    pub fn to_raw(self) -> Option<i32> {
        match self {
            DefaultTtl::Off => None,
            DefaultTtl::NoDefault => Some(-1),
            // In range by construction.
            DefaultTtl::After(s) => Some(s.get() as i32),
        }
    }

    /// Whether TTL is on (-1 or n).
    pub fn is_on(self) -> bool {
        self != DefaultTtl::Off
    }
}

/// A document's own `ttl` property. Absent (`None` where it is held) means "inherit".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DocumentTtl {
    /// `-1`: never expires.
    Never,
    /// `m`: expires `m` seconds after the last write (when the collection's TTL is on).
    After(TtlSeconds),
}

impl DocumentTtl {
    /// Validates the `ttl` property of a body: a whole number 1..=int32 max, or -1. Anything
    /// else (0, other negatives, null, fractions, strings, bools, objects, arrays) is rejected
    /// with the raw JSON value in the message.
    pub fn from_json(value: &Value) -> Result<Self, InvalidInput> {
        let invalid = || InvalidInput::DocumentTtl {
            raw: value.to_string(),
        };
        let n = match value {
            Value::Number(n) => n.as_i64().ok_or_else(invalid)?,
            _ => return Err(invalid()),
        };
        Self::from_i64(n).map_err(|_| invalid())
    }

    /// Validates a `ttl` given as an integer (the request field).
    pub fn from_i64(n: i64) -> Result<Self, InvalidInput> {
        match n {
            -1 => Ok(DocumentTtl::Never),
            _ => TtlSeconds::new(n)
                .map(DocumentTtl::After)
                .ok_or(InvalidInput::DocumentTtl { raw: n.to_string() }),
        }
    }

    /// The stored integer: -1 or m.
    pub fn to_raw(self) -> i32 {
        match self {
            DocumentTtl::Never => -1,
            // In range by construction.
            DocumentTtl::After(s) => s.get() as i32,
        }
    }

    /// A document's own ttl as stored (`0`: it inherits, else [`DocumentTtl::to_raw`]);
    /// `None` if no ttl stores as `raw`.
    pub fn from_stored(raw: i32) -> Option<Option<Self>> {
        match raw {
            0 => Some(None),
            n => Self::from_i64(i64::from(n)).ok().map(Some),
        }
    }

    /// A document's own ttl as stored: `0` when it inherits.
    pub fn to_stored(ttl: Option<Self>) -> i32 {
        ttl.map_or(0, DocumentTtl::to_raw)
    }

    /// The value as a JSON number, for writing it into a body.
    pub fn to_json(self) -> Value {
        Value::from(self.to_raw())
    }
}

impl fmt::Display for DocumentTtl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_raw())
    }
}

/// The TTL that applies to a document (SPEC §3's matrix), `None` = never expires.
pub(crate) fn effective_ttl(
    document: Option<DocumentTtl>,
    default: DefaultTtl,
) -> Option<TtlSeconds> {
    match (default, document) {
        // Off wins over everything, even a document's own ttl (which is kept, not honoured).
        (DefaultTtl::Off, _) => None,
        (_, Some(DocumentTtl::Never)) => None,
        (_, Some(DocumentTtl::After(m))) => Some(m),
        (DefaultTtl::NoDefault, None) => None,
        (DefaultTtl::After(n), None) => Some(n),
    }
}

/// The instant a document written at `last_write` expires under the given rules; `None` = never.
/// Kept at millisecond precision: the document is visible for its full TTL.
pub(crate) fn expires_at(
    last_write: Millis,
    document: Option<DocumentTtl>,
    default: DefaultTtl,
) -> Option<Millis> {
    effective_ttl(document, default).map(|ttl| last_write + ttl.millis())
}

/// Whether a document with that expiry instant is visible at `now`: never at or after it.
pub(crate) fn is_visible(expires_at: Option<Millis>, now: Millis) -> bool {
    expires_at.is_none_or(|e| now < e)
}

/// What earlier default TTLs made final (SPEC §4, "expired is final"), as two instants.
///
/// A document that was ever expired under the default in force at the time stays expired,
/// whatever the settings do next. Under a default `n`, an inheriting document written at `w`
/// expired at `w + n`; with own ttl `m`, at `w + m` while TTL was on. So a change at `T` away
/// from a default `n` kills every inheritor written at or before `T - n`, and a change away
/// from any default that was on kills every own-ttl document whose `w + m <= T`: two maxima
/// cover every change ever made. They are stored in the same durable record as the new
/// settings, so neither a later change nor a crash before the purge brings such a document
/// back, and a settings change marks nothing document by document.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpiredThrough {
    /// Inheriting documents last written at or before this instant are expired (0: none).
    pub inherited_written_by: Millis,
    /// Documents with their own ttl whose expiry instant is at or before this are expired
    /// (0: none).
    pub own_expired_by: Millis,
    /// When the default in force took effect (0: when the collection was made): an inheritor
    /// it expires at once expired then, not at its last write plus the new default.
    pub default_since: Millis,
}

impl ExpiredThrough {
    /// The marks after the default `old` gives way to another at `at`.
    pub(crate) fn after_change(self, old: DefaultTtl, at: Millis) -> Self {
        let mut next = self;
        if let DefaultTtl::After(n) = old {
            next.inherited_written_by =
                next.inherited_written_by.max(at.saturating_sub(n.millis()));
        }
        if old.is_on() {
            next.own_expired_by = next.own_expired_by.max(at);
        }
        next.default_since = at;
        next
    }

    /// Whether a document written at `last_write` with own ttl `ttl` is expired by these marks.
    pub(crate) fn covers(&self, last_write: Millis, ttl: Option<DocumentTtl>) -> bool {
        match ttl {
            None => self.inherited_written_by != 0 && last_write <= self.inherited_written_by,
            Some(DocumentTtl::Never) => false,
            Some(DocumentTtl::After(m)) => last_write + m.millis() <= self.own_expired_by,
        }
    }
}

/// A collection's expiry rules as the engine applies them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// The default TTL in force.
    pub default_ttl: DefaultTtl,
    /// What earlier defaults made final.
    pub expired: ExpiredThrough,
}

impl Rules {
    /// Whether a document is visible at `now`: not expired by an earlier default, and not at or
    /// past its expiry under the current one.
    pub(crate) fn is_visible(
        &self,
        last_write: Millis,
        ttl: Option<DocumentTtl>,
        now: Millis,
    ) -> bool {
        !self.expired.covers(last_write, ttl)
            && is_visible(expires_at(last_write, ttl, self.default_ttl), now)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secs(n: i64) -> TtlSeconds {
        TtlSeconds::new(n).expect("in range")
    }

    #[test]
    fn the_ttl_matrix_of_spec_section_3() {
        let off = DefaultTtl::Off;
        let no_default = DefaultTtl::NoDefault;
        let n = DefaultTtl::After(secs(3600));
        let m = Some(DocumentTtl::After(secs(60)));
        let never = Some(DocumentTtl::Never);
        // document has no ttl
        assert_eq!(effective_ttl(None, off), None);
        assert_eq!(effective_ttl(None, no_default), None);
        assert_eq!(effective_ttl(None, n), Some(secs(3600)));
        // document ttl = -1
        assert_eq!(effective_ttl(never, off), None);
        assert_eq!(effective_ttl(never, no_default), None);
        assert_eq!(effective_ttl(never, n), None);
        // document ttl = m
        assert_eq!(
            effective_ttl(m, off),
            None,
            "kept but ignored while TTL is off"
        );
        assert_eq!(effective_ttl(m, no_default), Some(secs(60)));
        assert_eq!(effective_ttl(m, n), Some(secs(60)));
    }

    #[test]
    fn visible_until_the_millisecond_before_expiry() {
        let written = 1_000_000;
        let at = expires_at(
            written,
            Some(DocumentTtl::After(secs(1))),
            DefaultTtl::NoDefault,
        );
        assert_eq!(at, Some(written + 1_000));
        assert!(is_visible(at, written + 999));
        assert!(!is_visible(at, written + 1_000));
        assert!(!is_visible(at, written + 5_000));
        assert!(is_visible(None, Millis::MAX));
    }

    #[test]
    fn expired_is_final_across_any_sequence_of_defaults() {
        // Model: a document is dead once it was expired at some instant under the default in
        // force then. Checked against the two marks over every pair of changes.
        let defaults = [
            DefaultTtl::Off,
            DefaultTtl::NoDefault,
            DefaultTtl::After(secs(10)),
            DefaultTtl::After(secs(100)),
        ];
        let ttls = [
            None,
            Some(DocumentTtl::Never),
            Some(DocumentTtl::After(secs(30))),
        ];
        let (t1, t2, t3) = (50_000, 120_000, 400_000);
        for d0 in defaults {
            for d1 in defaults {
                for d2 in defaults {
                    let marks = ExpiredThrough::default()
                        .after_change(d0, t1)
                        .after_change(d1, t2);
                    let rules = Rules {
                        default_ttl: d2,
                        expired: marks,
                    };
                    for ttl in ttls {
                        for w in (0..t2).step_by(5_000) {
                            // Written before a period ended, it lived under that period's
                            // default and died if its expiry came by the period's end.
                            let periods = [(d0, t1), (d1, t2)];
                            let dead_before = periods.iter().any(|&(d, end)| {
                                w < end && expires_at(w, ttl, d).is_some_and(|e| e <= end)
                            });
                            let expected = !dead_before && is_visible(expires_at(w, ttl, d2), t3);
                            assert_eq!(
                                rules.is_visible(w, ttl, t3),
                                expected,
                                "{d0:?} → {d1:?} → {d2:?}, ttl {ttl:?}, written {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    const TAIL: &str = "is invalid. Ensure to provide a nonzero positive integer less than or equal to '2147483647', or '-1' which means never expire.";

    #[test]
    fn default_ttl_validation_uses_the_cosmos_message() {
        assert_eq!(DefaultTtl::from_raw(None), Ok(DefaultTtl::Off));
        assert_eq!(DefaultTtl::from_raw(Some(-1)), Ok(DefaultTtl::NoDefault));
        assert_eq!(
            DefaultTtl::from_raw(Some(1)),
            Ok(DefaultTtl::After(secs(1)))
        );
        assert_eq!(
            DefaultTtl::from_raw(Some(2_147_483_647)),
            Ok(DefaultTtl::After(secs(2_147_483_647)))
        );
        for bad in [0, -10, -2, 2_147_483_648, i64::MAX, i64::MIN] {
            let err = DefaultTtl::from_raw(Some(bad)).expect_err("invalid");
            assert_eq!(
                err.to_string(),
                format!("The input defaultTtl '{bad}' {TAIL}")
            );
        }
    }

    #[test]
    fn document_ttl_validation_uses_the_cosmos_message_with_the_raw_value() {
        assert_eq!(DocumentTtl::from_json(&json!(-1)), Ok(DocumentTtl::Never));
        assert_eq!(
            DocumentTtl::from_json(&json!(60)),
            Ok(DocumentTtl::After(secs(60)))
        );
        assert_eq!(
            DocumentTtl::from_json(&json!(2_147_483_647)),
            Ok(DocumentTtl::After(secs(2_147_483_647)))
        );
        let cases = [
            (json!(0), "0"),
            (json!(-10), "-10"),
            (json!(-2), "-2"),
            (json!(null), "null"),
            (json!(1.5), "1.5"),
            (json!("60"), "\"60\""),
            (json!(true), "true"),
            (json!({"s": 1}), "{\"s\":1}"),
            (json!([60]), "[60]"),
            (json!(2_147_483_648i64), "2147483648"),
            (json!(1e300), "1e+300"),
        ];
        for (value, raw) in cases {
            let err = DocumentTtl::from_json(&value).expect_err("invalid");
            assert_eq!(err.to_string(), format!("The input ttl '{raw}' {TAIL}"));
        }
        let err = DocumentTtl::from_i64(0).expect_err("invalid");
        assert_eq!(err.to_string(), format!("The input ttl '0' {TAIL}"));
    }
}
