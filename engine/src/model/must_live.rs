//! Must-live rules: kinds of documents a collection keeps forever, whatever its default TTL.
//!
//! A collection mixing lifetimes (carts that expire beside orders that must not) depends on
//! every writer remembering `"ttl": -1` on the long-lived kind; one forgotten call and those
//! documents inherit the default and vanish. A rule names the kind by the value at a path
//! (`/type` is `"order"`), and a write storing a matching document without `"ttl": -1` is
//! refused. The document has to say so itself, not merely not expire under today's default,
//! so that a later default change cannot make it expire either.

use serde_json::{Map, Value};

use super::{
    invalid::InvalidInput,
    partition_key::{PartitionKeyPath, PartitionKeyValue},
    ttl::DocumentTtl,
};

/// Most rules a collection may have.
pub const MAX_MUST_LIVE_RULES: usize = 16;
/// Most values one rule may list.
pub const MAX_MUST_LIVE_VALUES: usize = 64;
/// Most bytes a collection's rules may take, paths and values as JSON: they travel with every
/// description of the collection (unpaged in `ListCollections`).
pub const MAX_MUST_LIVE_BYTES: usize = 16 * 1024;

/// One rule: documents whose value at `path` is one of `values` must never expire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MustLiveRule {
    path: PartitionKeyPath,
    values: Vec<PartitionKeyValue>,
}

impl MustLiveRule {
    /// Checks a rule: a path as partition key paths are written (`/type`, `/meta/kind`) and
    /// 1 to [`MAX_MUST_LIVE_VALUES`] scalar JSON values (string, number, bool or null).
    pub fn new(path: &str, values: &[Value]) -> Result<Self, InvalidInput> {
        let invalid = |reason: String| InvalidInput::MustLiveRule {
            path: path.to_owned(),
            reason,
        };
        let parsed = PartitionKeyPath::parse(path).map_err(|e| match e {
            InvalidInput::PartitionKeyPath { reason, .. } => invalid(reason),
            other => other,
        })?;
        if values.is_empty() || values.len() > MAX_MUST_LIVE_VALUES {
            return Err(invalid(format!(
                "it lists {} values; a rule lists 1 to {MAX_MUST_LIVE_VALUES}",
                values.len()
            )));
        }
        let mut scalars = Vec::with_capacity(values.len());
        for value in values {
            let scalar = PartitionKeyValue::from_json(value).map_err(|e| {
                invalid(match e {
                    InvalidInput::PartitionKeyValueType { found, .. } => {
                        format!(
                            "a value is {found}; values must be strings, numbers, bools or null"
                        )
                    }
                    InvalidInput::PartitionKeyTooLong { bytes, limit } => format!(
                        "a value is {bytes} bytes of UTF-8; values are at most {limit} bytes"
                    ),
                    other => format!("a value is unusable: {other}"),
                })
            })?;
            if !scalars.contains(&scalar) {
                scalars.push(scalar);
            }
        }
        Ok(MustLiveRule {
            path: parsed,
            values: scalars,
        })
    }

    /// The path the rule reads.
    pub fn path(&self) -> &str {
        self.path.as_str()
    }

    /// The values that make a document must-live, as JSON.
    pub fn values(&self) -> Vec<Value> {
        self.values.iter().filter_map(|v| v.to_json()).collect()
    }

    /// The value that makes `body` match, if it does. An object or array at the path never
    /// matches: rule values are scalars.
    fn matched(&self, body: &Map<String, Value>) -> Option<&PartitionKeyValue> {
        let found = self.path.extract(body).ok()?;
        self.values.iter().find(|v| **v == found)
    }
}

/// A collection's must-live rules; none by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MustLive {
    rules: Vec<MustLiveRule>,
}

impl MustLive {
    /// At most [`MAX_MUST_LIVE_RULES`] rules, of at most [`MAX_MUST_LIVE_BYTES`] in all.
    pub fn new(rules: Vec<MustLiveRule>) -> Result<Self, InvalidInput> {
        if rules.len() > MAX_MUST_LIVE_RULES {
            return Err(InvalidInput::MustLiveRules {
                reason: format!(
                    "a collection has at most {MAX_MUST_LIVE_RULES} must-live rules; this request gives {}",
                    rules.len()
                ),
            });
        }
        let bytes: usize = rules
            .iter()
            .map(|r| {
                r.path().len()
                    + r.values()
                        .iter()
                        .map(|v| v.to_string().len())
                        .sum::<usize>()
            })
            .sum();
        if bytes > MAX_MUST_LIVE_BYTES {
            return Err(InvalidInput::MustLiveRules {
                reason: format!(
                    "a collection's must-live rules take at most {MAX_MUST_LIVE_BYTES} bytes (paths and values as JSON); these take {bytes}"
                ),
            });
        }
        Ok(MustLive { rules })
    }

    /// The rules, in the order given.
    pub fn rules(&self) -> &[MustLiveRule] {
        &self.rules
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Refuses a body that matches a rule without saying `"ttl": -1`. `collection` names the
    /// collection in the message.
    pub fn check(
        &self,
        collection: &str,
        body: &Map<String, Value>,
        ttl: Option<DocumentTtl>,
    ) -> Result<(), InvalidInput> {
        if ttl == Some(DocumentTtl::Never) {
            return Ok(());
        }
        for rule in &self.rules {
            if let Some(value) = rule.matched(body) {
                return Err(InvalidInput::MustLive {
                    collection: collection.to_owned(),
                    path: rule.path().to_owned(),
                    value: value.to_string(),
                    ttl: ttl.map(|t| t.to_string()),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::TtlSeconds;

    fn body(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("an object"),
        }
    }

    fn orders() -> MustLive {
        MustLive::new(vec![
            MustLiveRule::new("/type", &[json!("order"), json!("invoice")]).expect("valid"),
            MustLiveRule::new("/meta/keep", &[json!(true)]).expect("valid"),
        ])
        .expect("valid")
    }

    #[test]
    fn a_matching_document_must_say_ttl_minus_one() {
        let rules = orders();
        let order = body(json!({"id": "o1", "type": "order"}));
        let err = rules.check("carts", &order, None).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "collection 'carts' keeps documents whose /type is \"order\" forever (a must-live rule), and this one has no \"ttl\": -1, so it would inherit the collection's default TTL; give it \"ttl\": -1 (DocumentTtl::Never in the Rust client), or change the rule with ReplaceCollection"
        );
        let own = Some(DocumentTtl::After(TtlSeconds::new(60).expect("valid")));
        let err = rules.check("carts", &order, own).expect_err("refused");
        assert!(
            err.to_string()
                .contains("has \"ttl\": 60, so it would expire"),
            "{err}"
        );
        rules
            .check("carts", &order, Some(DocumentTtl::Never))
            .expect("says it lives");
        let nested = body(json!({"id": "x", "meta": {"keep": true}}));
        assert!(rules.check("carts", &nested, None).is_err());
    }

    #[test]
    fn other_documents_pass() {
        let rules = orders();
        for other in [
            json!({"id": "c1", "type": "cart"}),
            json!({"id": "c2"}),
            json!({"id": "c3", "type": ["order"]}),
            json!({"id": "c4", "type": {"order": 1}}),
            json!({"id": "c5", "meta": {"keep": "true"}}),
            json!({"id": "c6", "meta": true}),
        ] {
            rules
                .check("carts", &body(other), None)
                .expect("no rule matches");
        }
        MustLive::default()
            .check("carts", &body(json!({"id": "o", "type": "order"})), None)
            .expect("no rules");
    }

    #[test]
    fn numbers_match_as_numbers() {
        let rules = MustLive::new(vec![
            MustLiveRule::new("/tier", &[json!(1)]).expect("valid"),
        ])
        .expect("valid");
        assert!(
            rules
                .check("c", &body(json!({"id": "a", "tier": 1.0})), None)
                .is_err()
        );
        assert!(
            rules
                .check("c", &body(json!({"id": "a", "tier": "1"})), None)
                .is_ok()
        );
    }

    #[test]
    fn bad_rules_are_named() {
        let cases = [
            ("type", vec![json!("order")], "must start with '/'"),
            ("/type", vec![], "it lists 0 values"),
            ("/type", vec![json!({"a": 1})], "a value is an object"),
            ("/_ts", vec![json!(1)], "system property"),
        ];
        for (path, values, says) in cases {
            let err = MustLiveRule::new(path, &values).expect_err("refused");
            assert!(matches!(err, InvalidInput::MustLiveRule { .. }), "{err:?}");
            assert!(err.to_string().contains(says), "{err}");
        }
        let many = vec![json!(1); MAX_MUST_LIVE_VALUES + 1];
        assert!(MustLiveRule::new("/n", &many).is_err());
        let rule = MustLiveRule::new("/n", &[json!(1), json!(1.0)]).expect("valid");
        assert_eq!(rule.values(), vec![json!(1.0)]);
        let too_many = vec![rule; MAX_MUST_LIVE_RULES + 1];
        assert!(MustLive::new(too_many).is_err());
        let long = MustLiveRule::new("/n", &[json!("x".repeat(3000))]).expect_err("too long");
        assert!(long.to_string().contains("a value is 3000 bytes"), "{long}");
        let values: Vec<Value> = (0..9)
            .map(|i| json!(format!("{i}{}", "x".repeat(2000))))
            .collect();
        let big = MustLiveRule::new("/n", &values).expect("each fits");
        let err = MustLive::new(vec![big]).expect_err("over 16 KiB in all");
        assert!(err.to_string().contains("at most 16384 bytes"), "{err}");
    }
}
