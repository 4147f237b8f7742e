//! TTL as types instead of magic integers.

use std::time::Duration;

/// A document's own TTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocumentTtl {
    /// No own TTL: the collection's default applies (the `ttl` property is removed).
    Inherit,
    /// Never expires, whatever the collection's default (`ttl: -1`).
    Never,
    /// Expires this long after the last write (whole seconds, rounded up), if the collection has
    /// TTL on.
    After(Duration),
    /// For a replace: the TTL of the version replaced, whatever the body says (a replace
    /// without a TTL would make the document inherit the collection default). The client reads
    /// that version first and writes with `if_match` on it, so the TTL kept is the one of the
    /// version overwritten; a write landing in between makes it read again. Not for create
    /// or upsert, which are refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let server = mayfly_server::RunningServer::start(Default::default()).await?;
    /// # let client = mayfly_client::Client::connect(server.local_addr().to_string()).await?;
    /// # let db = client.create_database("app").await?;
    /// # let c = db.create_collection("c", "/k").default_ttl(mayfly_client::DefaultTtl::NoDefault).await?;
    /// use std::time::Duration;
    /// use mayfly_client::DocumentTtl;
    /// c.create(&serde_json::json!({"id": "a", "k": 1})).ttl(DocumentTtl::After(Duration::from_secs(60))).await?;
    /// let doc = c.replace("a", 1, &serde_json::json!({"id": "a", "k": 1, "n": 2}))
    ///     .ttl(DocumentTtl::Keep)
    ///     .await?
    ///     .into_document()
    ///     .expect("was there");
    /// assert_eq!(doc.ttl(), DocumentTtl::After(Duration::from_secs(60)));
    /// # Ok(()) }
    /// ```
    Keep,
}

/// A collection's default TTL (Cosmos DB's `defaultTtl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultTtl {
    /// TTL off: nothing in the collection expires, not even documents with their own TTL.
    Off,
    /// TTL on without a default (`-1`): only documents with their own TTL expire.
    NoDefault,
    /// Documents expire this long after their last write (whole seconds, rounded up) unless
    /// they override it.
    After(Duration),
}

/// The one place TTLs become wire integers: seconds rounded up (a document never lives shorter
/// than asked), -1 for never. Values the server rejects (0, above 2,147,483,647 s) are sent as
/// they are, so the error comes from the server's single set of rules.
pub(crate) fn wire_seconds(ttl: Option<Duration>) -> i64 {
    match ttl {
        None => -1,
        Some(d) => {
            let whole = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            i64::try_from(whole).unwrap_or(i64::MAX)
        }
    }
}

impl DocumentTtl {
    /// The `ttl` value to send, or `None` to inherit. `Keep` is resolved to the TTL read
    /// before this is called.
    pub(crate) fn to_wire(self) -> Option<i64> {
        match self {
            DocumentTtl::Inherit | DocumentTtl::Keep => None,
            DocumentTtl::Never => Some(wire_seconds(None)),
            DocumentTtl::After(d) => Some(wire_seconds(Some(d))),
        }
    }

    pub(crate) fn from_wire(raw: Option<i32>) -> Self {
        match raw {
            None => DocumentTtl::Inherit,
            Some(-1) => DocumentTtl::Never,
            Some(s) => DocumentTtl::After(Duration::from_secs(u64::try_from(s).unwrap_or(0))),
        }
    }
}

impl DefaultTtl {
    /// The `defaultTtl` value to send: `None` is off.
    pub(crate) fn to_wire(self) -> Option<i64> {
        match self {
            DefaultTtl::Off => None,
            DefaultTtl::NoDefault => Some(wire_seconds(None)),
            DefaultTtl::After(d) => Some(wire_seconds(Some(d))),
        }
    }

    pub(crate) fn from_wire(raw: Option<i32>) -> Self {
        match raw {
            None => DefaultTtl::Off,
            Some(-1) => DefaultTtl::NoDefault,
            Some(s) => DefaultTtl::After(Duration::from_secs(u64::try_from(s).unwrap_or(0))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(
            DocumentTtl::After(Duration::from_millis(1500)).to_wire(),
            Some(2)
        );
        assert_eq!(
            DocumentTtl::After(Duration::from_secs(60)).to_wire(),
            Some(60)
        );
        assert_eq!(
            DocumentTtl::After(Duration::ZERO).to_wire(),
            Some(0),
            "sent as is: the server rejects it"
        );
        assert_eq!(DocumentTtl::Never.to_wire(), Some(-1));
        assert_eq!(DocumentTtl::Inherit.to_wire(), None);
        assert_eq!(DefaultTtl::Off.to_wire(), None);
        assert_eq!(DefaultTtl::NoDefault.to_wire(), Some(-1));
    }

    #[test]
    fn wire_values_read_back() {
        for ttl in [
            DocumentTtl::Inherit,
            DocumentTtl::Never,
            DocumentTtl::After(Duration::from_secs(9)),
        ] {
            let raw = ttl.to_wire().map(|s| i32::try_from(s).expect("small"));
            assert_eq!(DocumentTtl::from_wire(raw), ttl);
        }
        for ttl in [
            DefaultTtl::Off,
            DefaultTtl::NoDefault,
            DefaultTtl::After(Duration::from_secs(9)),
        ] {
            let raw = ttl.to_wire().map(|s| i32::try_from(s).expect("small"));
            assert_eq!(DefaultTtl::from_wire(raw), ttl);
        }
    }
}
