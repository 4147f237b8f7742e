//! Routing by the partition map (cluster mode): a request that names its partition key goes
//! straight to the node that owns the partition, found as the server finds it
//! (docs/cluster.md, "Partitions": xxh3-64, seed 0, of `database id | 0x00 | collection id |
//! 0x00 | partition key in its order-preserving encoding`, modulo the partition count). The map
//! comes from `Admin/GetPartitionMap`, fetched in the background when the client is first used
//! and again after a request fails as a moved partition's would, or when it is 10 s old.
//! Routing only saves a hop: any node forwards a request to the partition's owner, so a map
//! out of date costs latency, never a wrong answer. A single server answers a map without
//! nodes, and the client then sends everything to it, as before.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use mayfly_proto::v1::{GetPartitionMapRequest, client::AdminClient, client::DocumentsClient};
use std::sync::Mutex;
use tonic::transport::Channel;
use xxhash_rust::xxh3::xxh3_64;

use crate::{
    PartitionKey,
    client::{Credentials, MAX_MESSAGE_BYTES, Transport},
};

/// How long a map is trusted before it is fetched again.
const MAP_TTL: Duration = Duration::from_secs(10);

/// How long a single server's answer (no nodes: nothing to route) holds before it is asked
/// again.
const SINGLE_TTL: Duration = Duration::from_secs(60);

/// The least time between two fetches of the map: failures do not make a client hammer its
/// server (each map reads every partition's lease from NATS).
const MIN_FETCH_GAP: Duration = Duration::from_secs(1);

/// How long a fetch may take before it is given up (and tried again later).
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long routing pauses after a routed request could not connect to the owner (its
/// advertised address unreachable from here, say): requests go to the client's server.
const CONNECT_PAUSE: Duration = Duration::from_secs(60);

/// Where each partition is served, as the map last said.
#[derive(Debug)]
struct Routes {
    /// 0: nothing to route (a single server, or a placement a client cannot compute).
    partitions: usize,
    /// By partition: the owner's address (`http://…` or `https://…`); empty when none.
    owners: Vec<String>,
    fetched: Instant,
}

#[derive(Debug, Default)]
struct State {
    routes: Option<Arc<Routes>>,
    /// A fetch is under way.
    fetching: bool,
    /// When the last fetch began.
    last_fetch: Option<Instant>,
    /// Routing is paused until then (a routed request could not connect).
    paused_until: Option<Instant>,
    /// A request failed as one sent to a node that no longer owns its partition would: the
    /// map is fetched again before it is trusted.
    stale: bool,
    /// One connection per node.
    channels: HashMap<String, DocumentsClient<Transport>>,
}

/// Makes connections to the nodes with the client's own settings (TLS, timeouts, keepalive).
pub(crate) type Connector = Arc<dyn Fn(&str) -> Option<Channel> + Send + Sync>;

/// Sends each request that names its partition to the partition's owner.
#[derive(Clone)]
pub(crate) struct Router {
    admin: AdminClient<Transport>,
    credentials: Credentials,
    connect: Connector,
    /// Whether the client's connections use TLS (only nodes of the same scheme are used).
    tls: bool,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f.debug_struct("Router")
            .field("routes", &state.routes)
            .field("stale", &state.stale)
            .finish_non_exhaustive()
    }
}

impl Router {
    pub(crate) fn new(
        channel: Channel,
        credentials: Credentials,
        connect: Connector,
        tls: bool,
    ) -> Self {
        Router {
            admin: AdminClient::with_interceptor(channel, credentials.clone()),
            credentials,
            connect,
            tls,
            state: Arc::default(),
        }
    }

    /// The connection to the owner of `partition_key`'s partition in `database`/`collection`,
    /// if the map names one this client can reach; `None`: send it to the client's server.
    pub(crate) fn documents_for(
        &self,
        database: &str,
        collection: &str,
        partition_key: &PartitionKey,
    ) -> Option<DocumentsClient<Transport>> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = match &state.routes {
            None => true,
            Some(r) if r.partitions == 0 => r.fetched.elapsed() > SINGLE_TTL,
            Some(r) => state.stale || r.fetched.elapsed() > MAP_TTL,
        };
        let gap_passed = state
            .last_fetch
            .is_none_or(|at| at.elapsed() >= MIN_FETCH_GAP);
        if due && !state.fetching && gap_passed {
            // Off the request's path: this request goes by what is known now.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                state.fetching = true;
                state.last_fetch = Some(Instant::now());
                runtime.spawn(self.clone().fetch());
            }
        }
        let routes = state.routes.clone()?;
        let paused = state
            .paused_until
            .is_some_and(|until| Instant::now() < until);
        if routes.partitions == 0 || state.stale || paused {
            return None;
        }
        let p = partition(database, collection, partition_key, routes.partitions);
        let address = routes.owners.get(p).filter(|a| !a.is_empty())?;
        if address.starts_with("https://") != self.tls {
            return None;
        }
        if let Some(client) = state.channels.get(address) {
            return Some(client.clone());
        }
        let client =
            DocumentsClient::with_interceptor((self.connect)(address)?, self.credentials.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
        state.channels.insert(address.clone(), client.clone());
        Some(client)
    }

    /// A request failed as one to a node that lost its partition would (unavailable, or not
    /// reached): requests go to the client's server until the map is fetched again.
    pub(crate) fn suspect(&self) {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .stale = true;
    }

    /// A request could not connect (perhaps to an owner's advertised address this client
    /// cannot reach): routing pauses for [`CONNECT_PAUSE`]. Whether it was routing until now,
    /// so that the caller may send the request again at once, to its own server.
    pub(crate) fn pause(&self) -> bool {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let was_routing = state
            .paused_until
            .is_none_or(|until| Instant::now() >= until)
            && state.routes.as_ref().is_some_and(|r| r.partitions > 0);
        state.paused_until = Some(Instant::now() + CONNECT_PAUSE);
        was_routing
    }

    async fn fetch(self) {
        let mut admin = self.admin.clone();
        let answer = tokio::time::timeout(
            FETCH_TIMEOUT,
            admin.get_partition_map(GetPartitionMapRequest {}),
        )
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("the map took too long")));
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.fetching = false;
        let map = match answer {
            Ok(map) => map.into_inner(),
            // Not answered: the map known so far holds, and is asked for again at the next
            // request once it is due. A first answer that fails (an older server, a server
            // away) is taken as a single server's, asked again in a minute.
            // (A failure to fetch says nothing against the map known so far: trusted again.)
            Err(_) => {
                state.stale = false;
                match &state.routes {
                    Some(routes) => {
                        state.routes = Some(Arc::new(Routes {
                            partitions: routes.partitions,
                            owners: routes.owners.clone(),
                            fetched: Instant::now(),
                        }));
                    }
                    None => {
                        state.routes = Some(Arc::new(Routes {
                            partitions: 0,
                            owners: Vec::new(),
                            fetched: Instant::now(),
                        }));
                    }
                }
                return;
            }
        };
        let addresses: HashMap<&str, &str> = map
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.address.as_str()))
            .collect();
        let routable = !map.nodes.is_empty() && map.placement == "xxh3-64";
        let mut owners = vec![String::new(); map.partitions as usize];
        for o in &map.owners {
            if let (Some(slot), Some(address)) = (
                owners.get_mut(o.partition as usize),
                addresses.get(o.owner.as_str()),
            ) {
                *slot = (*address).to_owned();
            }
        }
        // Connections to nodes gone from the map are dropped.
        state.channels.retain(|address, _| owners.contains(address));
        state.routes = Some(Arc::new(Routes {
            partitions: if routable { map.partitions as usize } else { 0 },
            owners,
            fetched: Instant::now(),
        }));
        state.stale = false;
    }
}

/// The partition of `partition_key` in `database`/`collection` over `partitions`, as the
/// server computes it (`engine/src/engine/placement.rs`).
pub(crate) fn partition(
    database: &str,
    collection: &str,
    partition_key: &PartitionKey,
    partitions: usize,
) -> usize {
    let mut key = Vec::with_capacity(database.len() + collection.len() + 16);
    key.extend_from_slice(database.as_bytes());
    key.push(0);
    key.extend_from_slice(collection.as_bytes());
    key.push(0);
    encode_ordered(partition_key, &mut key);
    (xxh3_64(&key) % partitions as u64) as usize
}

/// The server's order-preserving encoding of a partition key
/// (`PartitionKeyValue::encode_ordered`): a tag, then the value.
fn encode_ordered(partition_key: &PartitionKey, out: &mut Vec<u8>) {
    match partition_key {
        PartitionKey::Undefined => out.push(0x00),
        PartitionKey::Null => out.push(0x01),
        PartitionKey::Bool(false) => out.push(0x02),
        PartitionKey::Bool(true) => out.push(0x03),
        PartitionKey::Number(x) => {
            out.push(0x04);
            // -0 is 0 to the server.
            let x = if *x == 0.0 { 0.0 } else { *x };
            let bits = x.to_bits();
            let ordered = if bits >> 63 == 1 {
                !bits
            } else {
                bits | 1 << 63
            };
            out.extend_from_slice(&ordered.to_be_bytes());
        }
        PartitionKey::String(s) => {
            out.push(0x05);
            for &b in s.as_bytes() {
                out.push(b);
                if b == 0 {
                    out.push(0xFF);
                }
            }
            out.extend_from_slice(&[0x00, 0x01]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mayfly_server::{engine::xxh3_partition, model::PartitionKeyValue};

    #[test]
    fn a_key_lands_in_the_servers_partition() {
        let keys = [
            (PartitionKey::Undefined, PartitionKeyValue::Undefined),
            (PartitionKey::Null, PartitionKeyValue::Null),
            (PartitionKey::Bool(false), PartitionKeyValue::Bool(false)),
            (PartitionKey::Bool(true), PartitionKeyValue::Bool(true)),
            (PartitionKey::Number(-0.0), PartitionKeyValue::number(-0.0)),
            (PartitionKey::Number(0.0), PartitionKeyValue::number(0.0)),
            (PartitionKey::Number(1.5), PartitionKeyValue::number(1.5)),
            (PartitionKey::Number(-3.0), PartitionKeyValue::number(-3.0)),
            (
                PartitionKey::Number(1e300),
                PartitionKeyValue::number(1e300),
            ),
            (
                PartitionKey::String(String::new()),
                PartitionKeyValue::String("".into()),
            ),
            (
                PartitionKey::String("a\0b".into()),
                PartitionKeyValue::String("a\0b".into()),
            ),
            (
                PartitionKey::String("Zoë 🐝".into()),
                PartitionKeyValue::String("Zoë 🐝".into()),
            ),
        ];
        for partitions in [1, 7, 12, 64, 1024] {
            for (client, server) in &keys {
                assert_eq!(
                    partition("db", "coll", client, partitions),
                    xxh3_partition("db", "coll", server, partitions),
                    "{client:?} over {partitions}"
                );
            }
        }
        for i in 0..500 {
            let k = format!("user-{i}");
            assert_eq!(
                partition("shop", "orders", &PartitionKey::String(k.clone()), 64),
                xxh3_partition("shop", "orders", &PartitionKeyValue::String(k.into()), 64)
            );
        }
    }
}
