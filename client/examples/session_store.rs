//! A session store whose sessions expire after 30 minutes of inactivity (or `--idle-secs`).
//!
//! Every request touches the session, restarting its TTL clock; a session that sees no request
//! for the idle period disappears on its own, at its expiry instant.
//!
//! ```text
//! cargo run -p mayfly-server --bin mayfly &          # a server on 127.0.0.1:7070
//! cargo run -p mayfly-client --example session_store -- --idle-secs 2
//! ```
//! Without a server address argument it starts one in-process, so it also runs on its own.

mod support;

use std::time::Duration;

use mayfly_client::{Client, Collection, DefaultTtl, Ensured, Error, TouchOutcome, UpdateOutcome};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Session {
    id: String,
    user: String,
    cart: Vec<String>,
}

/// Sessions over a Mayfly collection whose default TTL is the idle timeout.
struct SessionStore {
    sessions: Collection,
}

impl SessionStore {
    async fn open(client: &Client, idle: Duration) -> Result<Self, Error> {
        let db = client
            .create_database_if_not_exists("webapp")
            .await?
            .into_inner();
        let sessions = match db
            .create_collection_if_not_exists("sessions", "/user")
            .default_ttl(DefaultTtl::After(idle))
            .await?
        {
            Ensured::Created(sessions) => sessions,
            // Made by an earlier run, perhaps with another idle timeout.
            Ensured::Existing(sessions, settings) => {
                if settings.default_ttl != DefaultTtl::After(idle) {
                    sessions.set_default_ttl(DefaultTtl::After(idle)).await?;
                }
                sessions
            }
        };
        Ok(SessionStore { sessions })
    }

    async fn login(&self, user: &str) -> Result<Session, Error> {
        let session = Session {
            id: format!("{user}-session"),
            user: user.to_owned(),
            cart: Vec::new(),
        };
        self.sessions.upsert(&session).await?;
        Ok(session)
    }

    /// Handles a request: the session is alive only if it was active within the idle period.
    async fn request(&self, user: &str, session_id: &str) -> Result<Option<Session>, Error> {
        match self.sessions.touch(session_id, user).await? {
            TouchOutcome::Touched(doc) => {
                println!("  {session_id}: active, {:?} left", doc.remaining());
                Ok(Some(doc.deserialize()?))
            }
            TouchOutcome::Missing => Ok(None),
        }
    }

    /// Read-modify-write that keeps the session's TTL, retrying if another request of the
    /// same user wrote in between.
    async fn add_to_cart(
        &self,
        user: &str,
        session_id: &str,
        item: &str,
    ) -> Result<Option<Session>, Error> {
        let outcome = self
            .sessions
            .update::<Session, _>(session_id, user, |session| {
                session.value_mut().cart.push(item.to_owned())
            })
            .await?;
        Ok(match outcome {
            UpdateOutcome::Updated { item, .. } => Some(item.into_value()),
            UpdateOutcome::Missing => None,
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut idle = Duration::from_secs(1800);
    let mut address = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--idle-secs" => {
                idle = Duration::from_secs(args.next().ok_or("--idle-secs needs a value")?.parse()?)
            }
            other => address = Some(other.to_owned()),
        }
    }
    let (client, _embedded) = support::connect(address).await?;
    let store = SessionStore::open(&client, idle).await?;

    println!("sessions expire after {idle:?} without a request");
    let session = store.login("ann").await?;
    store
        .add_to_cart("ann", &session.id, "teapot")
        .await?
        .expect("just logged in");
    store.login("bob").await?;

    // Ann keeps clicking; Bob wanders off.
    for _ in 0..3 {
        tokio::time::sleep(idle / 2).await;
        let alive = store
            .request("ann", &session.id)
            .await?
            .expect("ann is active");
        assert_eq!(alive.cart, ["teapot"]);
    }
    match store.request("bob", "bob-session").await? {
        Some(_) => println!("  bob-session: still alive"),
        None => println!("  bob-session: expired after {idle:?} of inactivity"),
    }
    Ok(())
}
