//! Idempotency keys and a rate limiter, on patch and transactional batch.
//!
//! - **Idempotency keys.** A payment carries a key chosen by its client; a retry of the same
//!   payment (after a timeout, say) carries the same key. The key's record and the payment's
//!   effect (the account balance) are written in one transactional batch, so the effect
//!   happens exactly once: a retry finds the key (the batch fails on its `create`, changing
//!   nothing) and answers with the stored result. Keys expire after `--key-ttl-secs` (a day by
//!   default), so the collection cleans itself.
//! - **Rate limiter.** A fixed window per client: one counter document per client and window,
//!   incremented by a conditional patch (`FROM c WHERE c.count < limit`), so concurrent
//!   requests never overshoot the limit and need no read-modify-write; each counter expires
//!   with its window.
//!
//! ```text
//! cargo run -p mayfly-server --bin mayfly &          # a server on 127.0.0.1:7070
//! MAYFLY_KEY=$(cat mayfly-data/keys/primary) cargo run -p mayfly-client --example idempotency -- 127.0.0.1:7070
//! ```
//! Without a server address argument it starts one in-process, so it also runs on its own.

mod support;

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mayfly_client::{
    Client, Collection, DefaultTtl, DocumentTtl, Error, PatchOps, PatchOutcome, Reason,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The outcome of a payment, stored with its key and replayed to retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    key: String,
    amount: i64,
    /// The balance the payment left; `None` for a retry that arrived while the first try
    /// was still recording it.
    #[serde(default)]
    balance: Option<i64>,
}

/// Payments and rate-limit windows of each client live in one partition (`/client`).
struct Service {
    docs: Collection,
    key_ttl: Duration,
}

impl Service {
    async fn open(client: &Client, key_ttl: Duration) -> Result<Self, Error> {
        let db = client
            .create_database_if_not_exists("payments")
            .await?
            .into_inner();
        // A fresh collection each run, so the example's figures start from zero.
        let _ = db.collection("ledger").delete().await;
        let docs = db
            .create_collection("ledger", "/client")
            .default_ttl(DefaultTtl::NoDefault)
            .await?;
        Ok(Service { docs, key_ttl })
    }

    async fn open_account(&self, client: &str) -> Result<(), Error> {
        self.docs
            .create(&json!({"id": "account", "client": client, "balance": 0}))
            .await?;
        Ok(())
    }

    /// Pays `amount` once per `key`, however often it is retried.
    async fn pay(&self, client: &str, key: &str, amount: i64) -> Result<Receipt, Error> {
        let record = format!("idem-{key}");
        let committed = self
            .docs
            .batch(client)
            .patch("account", PatchOps::new().incr("/balance", amount))
            .create(&json!({"id": record, "client": client, "key": key, "amount": amount}))
            .ttl(DocumentTtl::After(self.key_ttl))
            // The record learns the balance the payment left, in the same write.
            .read("account")
            .await;
        let results = match committed {
            Ok(results) => results,
            // The key's record exists: this payment was made, and nothing was applied again.
            Err(e)
                if e.operation_index() == Some(1)
                    && e.reason() == Some(&Reason::DocumentExists) =>
            {
                let done = self.docs.read(&record, client).await?.ok_or(e)?;
                return done.deserialize();
            }
            Err(e) => return Err(e),
        };
        let balance = results[2]
            .document()
            .and_then(|d| d.body()["balance"].as_i64())
            .unwrap_or_default();
        // Kept for retries to replay.
        self.docs
            .patch(&record, client)
            .set("/balance", balance)
            .ttl(DocumentTtl::After(self.key_ttl))
            .await?;
        Ok(Receipt {
            key: key.to_owned(),
            amount,
            balance: Some(balance),
        })
    }

    /// Counts a request against `client`'s window; `false` once `limit` were counted in it.
    /// `now` is the request's arrival, Unix epoch time.
    async fn allow(
        &self,
        client: &str,
        limit: u32,
        window: Duration,
        now: Duration,
    ) -> Result<bool, Error> {
        let id = format!("rate-{}", now.as_secs() / window.as_secs().max(1));
        let condition = format!("FROM c WHERE c.count < {limit}");
        loop {
            let counted = self
                .docs
                .patch(&id, client)
                .incr("/count", 1)
                .condition(&condition)
                .await;
            match counted {
                Ok(PatchOutcome::Patched(_) | PatchOutcome::Created(_)) => return Ok(true),
                Err(e) if e.reason() == Some(&Reason::ConditionNotMet) => return Ok(false),
                // The window's first request: its counter starts at 1 and expires with it.
                Ok(PatchOutcome::Missing) => {
                    let first = self
                        .docs
                        .create(&json!({"id": id, "client": client, "count": 1}))
                        .ttl(DocumentTtl::After(window))
                        .await;
                    match first {
                        Ok(_) => return Ok(true),
                        // Another request created it first: count against it.
                        Err(e) if e.reason() == Some(&Reason::DocumentExists) => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

async fn run(address: Option<String>) -> Result<(), Box<dyn std::error::Error>> {
    let (client, _embedded) = support::connect(address).await?;
    let service = Service::open(&client, Duration::from_secs(86_400)).await?;
    service.open_account("ann").await?;

    // A payment, its retry (same key), and another payment.
    let first = service.pay("ann", "k-1001", 30).await?;
    let retried = service.pay("ann", "k-1001", 30).await?;
    let second = service.pay("ann", "k-1002", 12).await?;
    println!("payment k-1001: {first:?}; retried: {retried:?}; payment k-1002: {second:?}");
    assert_eq!(first, retried, "a retry replays the receipt");
    assert_eq!(
        second.balance,
        Some(42),
        "30 + 12: the retry was not applied again"
    );

    // Twelve requests at once against a limit of 5 per minute (all arriving in one window).
    let service = Arc::new(service);
    let window = Duration::from_secs(60);
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let attempts: Vec<_> = (0..12)
        .map(|_| {
            let service = Arc::clone(&service);
            tokio::spawn(async move { service.allow("ann", 5, window, now).await })
        })
        .collect();
    let mut allowed = 0;
    for attempt in attempts {
        allowed += usize::from(attempt.await??);
    }
    println!(
        "12 concurrent requests, limit 5 per minute: {allowed} allowed, {} refused",
        12 - allowed
    );
    assert_eq!(allowed, 5, "the conditional increment never overshoots");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(std::env::args().nth(1)).await
}
