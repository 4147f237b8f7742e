//! A patch's condition (Cosmos DB's filter predicate): `FROM c WHERE ...`, evaluated by the
//! query engine over the one document the patch would change.

use mayfly_query::{Execution, ast::Query};
use serde_json::Map;

use super::{DocumentView, Error, InvalidInput, document::as_document, query_reads::context};

/// Longest condition text: a condition is a filter, not a program.
pub const MAX_CONDITION_BYTES: usize = 16 * 1024;

/// What a condition is the rest of.
const PREFIX: &str = "SELECT TOP 1 VALUE 1 ";

/// A parsed condition.
#[derive(Debug)]
pub struct PatchCondition {
    text: String,
    query: Query,
}

impl PatchCondition {
    /// Parses `FROM <alias> [JOIN ...] [WHERE <predicate>]`: a query without `SELECT`, which
    /// holds for a document when it yields at least one row for it. Clauses that only order,
    /// group or cut results (`ORDER BY`, `GROUP BY`, `OFFSET`) are refused as meaningless here.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let refuse = |reason: &str| {
            Err(Error::from(InvalidInput::PatchCondition {
                reason: reason.to_owned(),
            }))
        };
        if text.len() > MAX_CONDITION_BYTES {
            return refuse(&format!(
                "it is {} bytes; the limit is {MAX_CONDITION_BYTES}",
                text.len()
            ));
        }
        let trimmed = text.trim_start();
        if !trimmed
            .get(..4)
            .is_some_and(|w| w.eq_ignore_ascii_case("from"))
        {
            return refuse("it must start with FROM");
        }
        // TOP 1: the first matching row settles it. The text is parsed as written (leading
        // space included), so positions past the first line are the client's; those on it are
        // shifted back by the prefix.
        let query = mayfly_query::parse(&format!("{PREFIX}{text}")).map_err(|mut e| {
            if let Some(p) = e.position.as_mut()
                && p.line == 1
            {
                p.column = p.column.saturating_sub(PREFIX.len() as u32).max(1);
            }
            e
        })?;
        if !query.group_by.is_empty() || !query.order_by.is_empty() {
            return refuse("GROUP BY and ORDER BY have no meaning in a condition");
        }
        if query.offset_limit.is_some() {
            return refuse("OFFSET and LIMIT have no meaning in a condition");
        }
        if !query.parameters().is_empty() {
            return refuse("a condition takes no parameters; write the values in it");
        }
        Ok(PatchCondition {
            text: text.to_owned(),
            query,
        })
    }

    /// The condition as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether `document` matches, judged at its read instant.
    pub(super) fn holds(&self, document: &DocumentView) -> Result<bool, Error> {
        let params = Map::new();
        let mut run = Execution::new(&self.query, &params, context(document.read_at))?;
        run.push(&as_document(document))?;
        let matched = !run.take_ready().is_empty() || !run.finish()?.is_empty();
        Ok(matched)
    }

    /// Fails with [`Error::ConditionNotMet`] unless `document` matches.
    pub(super) fn check(&self, document: &DocumentView) -> Result<(), Error> {
        if self.holds(document)? {
            Ok(())
        } else {
            Err(Error::ConditionNotMet {
                id: document.key.id.to_string(),
                condition: self.text.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Etag, PartitionKeyValue, ResourceId};
    use crate::model::IdKind;
    use crate::storage::DocKey;

    fn view(json: &str) -> DocumentView {
        DocumentView {
            key: DocKey {
                partition_key: PartitionKeyValue::Null,
                id: ResourceId::parse(IdKind::Document, "d").expect("id"),
            },
            body: mayfly_json::encode(
                serde_json::from_str::<Map<String, serde_json::Value>>(json)
                    .as_ref()
                    .expect("json"),
            ),
            last_write: 5_000,
            etag: Etag(7),
            ttl: None,
            expires_at: None,
            read_at: 6_000,
        }
    }

    #[test]
    fn a_condition_holds_when_the_document_matches() {
        let doc = view(r#"{"id":"d","status":"active","n":3,"tags":["a","b"]}"#);
        let holds = |text: &str| {
            PatchCondition::parse(text)
                .expect("parses")
                .holds(&doc)
                .expect("evaluates")
        };
        assert!(holds("FROM c WHERE c.status = 'active'"));
        assert!(!holds("from c where c.status = 'closed'"));
        assert!(holds("FROM c WHERE c.n > 2 AND c._ts = 5"));
        assert!(!holds("FROM c WHERE c.missing = 1"));
        assert!(holds("FROM c JOIN t IN c.tags WHERE t = 'b'"));
        assert!(holds("FROM c"));
    }

    #[test]
    fn conditions_that_are_not_filters_are_refused() {
        for text in [
            "SELECT * FROM c",
            "WHERE c.x = 1",
            "FROM c ORDER BY c.x",
            "FROM c WHERE c.x = @x",
            "FROM c OFFSET 0 LIMIT 1",
            "FROM",
        ] {
            let err = PatchCondition::parse(text).expect_err(text);
            assert!(
                matches!(
                    err,
                    Error::Invalid(InvalidInput::PatchCondition { .. }) | Error::Query(_)
                ),
                "{text}: {err:?}"
            );
        }
        // Positions are the condition's own, not the query it is wrapped in.
        match PatchCondition::parse("FROM c WHERE c.x = = 1") {
            Err(Error::Query(e)) => {
                let p = e.position.expect("a position");
                assert_eq!(p.line, 1);
                assert!((17..=21).contains(&p.column), "{p}");
            }
            other => panic!("{other:?}"),
        }
        let long = format!("FROM c WHERE c.x = '{}'", "x".repeat(MAX_CONDITION_BYTES));
        assert!(PatchCondition::parse(&long).is_err());
    }
}
