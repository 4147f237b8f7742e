//! Ids of databases, collections and documents.

use std::{borrow::Borrow, fmt, sync::Arc};

use super::invalid::InvalidInput;

/// Longest id, in characters.
pub const MAX_ID_CHARS: usize = 255;

/// What an id names, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    /// A database id.
    Database,
    /// A collection id.
    Collection,
    /// A document id.
    Document,
}

impl fmt::Display for IdKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdKind::Database => "database",
            IdKind::Collection => "collection",
            IdKind::Document => "document",
        })
    }
}

/// A validated id: 1-255 characters, none of `/ \ ? #` (characters that would make a
/// resource address ambiguous). Shared: the index, the metadata and storage hold one copy.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId(Arc<str>);

impl ResourceId {
    /// Validates `raw` as an id of the given kind.
    pub fn parse(kind: IdKind, raw: &str) -> Result<Self, InvalidInput> {
        let chars = raw.chars().count();
        let bad_char = raw.chars().find(|c| matches!(c, '/' | '\\' | '?' | '#'));
        if chars == 0 || chars > MAX_ID_CHARS || bad_char.is_some() {
            return Err(InvalidInput::Id {
                kind,
                value: raw.to_owned(),
                chars,
                bad_char,
            });
        }
        Ok(ResourceId(raw.into()))
    }

    /// The empty string: sorts before every valid id, for range bounds only.
    pub(crate) fn min_value() -> Self {
        ResourceId("".into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ResourceId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// Id of a database.
pub type DatabaseId = ResourceId;
/// Id of a collection within its database.
pub type CollectionId = ResourceId;
/// Id of a document within its partition.
pub type DocumentId = ResourceId;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_1_to_255_characters_without_separators() {
        assert!(ResourceId::parse(IdKind::Document, "a").is_ok());
        assert!(
            ResourceId::parse(IdKind::Document, &"é".repeat(255)).is_ok(),
            "characters, not bytes"
        );
        assert!(ResourceId::parse(IdKind::Document, "SO05 spaces-and_ünïcode.ok").is_ok());
    }

    #[test]
    fn rejects_empty_long_and_separator_ids() {
        for bad in ["", "a/b", "a\\b", "a?b", "a#b"] {
            let err = ResourceId::parse(IdKind::Document, bad).expect_err(bad);
            assert!(err.to_string().contains("document id"), "{err}");
        }
        let err = ResourceId::parse(IdKind::Collection, &"x".repeat(256)).expect_err("too long");
        assert!(err.to_string().contains("256 characters"), "{err}");
    }
}
