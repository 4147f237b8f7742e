//! `mayfly.v1.Admin`: account keys and resource tokens, for read-write keys only.

use mayfly_proto::v1::{
    ClusterNode, CreateResourceTokenRequest, GetPartitionMapRequest, KeyKind, PartitionMap,
    PartitionOwner, RegenerateKeyRequest, RegenerateKeyResponse,
    ResourceToken as ResourceTokenProto, Standby, TokenPermission, server,
};
use tonic::{Request, Response, Status};

use std::sync::Arc;

use super::{caller, convert, forward::Owners, status::to_status};
use crate::{
    auth::{
        Action, Authenticator, DEFAULT_TOKEN_SECS, Denied, KeyAdminError, KeySlot, MAX_TOKEN_SECS,
        NoResources, Principal, ResourceToken, Target, bearer,
    },
    cluster_report::PartitionCopy,
    current_engine::CurrentEngine,
    engine::InvalidInput,
};

/// Serves key regeneration, token minting and the partition map.
#[derive(Debug, Clone)]
pub struct AdminService {
    engine: CurrentEngine,
    auth: Authenticator,
    /// In a cluster: who owns what, and this node's id.
    cluster: Option<Arc<dyn Owners>>,
}

impl AdminService {
    /// A service minting tokens for the resources of `engine`, for callers `auth` accepts.
    pub fn new(engine: CurrentEngine, auth: Authenticator) -> Self {
        AdminService {
            engine,
            auth,
            cluster: None,
        }
    }

    /// The same service, answering the partition map from `owners` (cluster mode).
    pub fn in_cluster(self, owners: Arc<dyn Owners>) -> Self {
        AdminService {
            cluster: Some(owners),
            ..self
        }
    }
}

fn key_slot(kind: i32) -> Result<KeySlot, InvalidInput> {
    match KeyKind::try_from(kind) {
        Ok(KeyKind::Primary) => Ok(KeySlot::Primary),
        Ok(KeyKind::Secondary) => Ok(KeySlot::Secondary),
        Ok(KeyKind::PrimaryReadOnly) => Ok(KeySlot::PrimaryReadOnly),
        Ok(KeyKind::SecondaryReadOnly) => Ok(KeySlot::SecondaryReadOnly),
        Ok(KeyKind::Unspecified) => Err(InvalidInput::MissingField {
            field: "kind",
            hint: "name the key to regenerate (KEY_KIND_PRIMARY, KEY_KIND_SECONDARY, ...)",
        }),
        Err(_) => Err(InvalidInput::UnknownEnumValue {
            field: "kind",
            value: kind,
        }),
    }
}

#[tonic::async_trait]
impl server::Admin for AdminService {
    async fn regenerate_key(
        &self,
        request: Request<RegenerateKeyRequest>,
    ) -> Result<Response<RegenerateKeyResponse>, Status> {
        let caller = caller(&self.auth, &request)?;
        // About the account: no token may, and no resource is consulted.
        caller.allow(Action::Manage, Target::Account, &NoResources)?;
        let RegenerateKeyRequest { kind } = request.into_inner();
        let slot = key_slot(kind).map_err(to_status)?;
        let auth = self.auth.clone();
        if let Some(keys) = auth.keys()
            && let Some(store) = keys.shared_store()
        {
            // A cluster's key: replaced in the cluster (on a quorum), answered once every node
            // takes the new key and none the old (see `cluster_keys`).
            let key = crate::auth::new_key();
            store.replace(slot, key.clone()).await.map_err(|e| {
                Status::unavailable(format!(
                    "the new {slot} could not be stored in the cluster, the old one stays in force: {e}"
                ))
            })?;
            keys.set(slot, key.clone());
            tokio::time::sleep(store.settles_in()).await;
            tracing::info!(key = %slot, "cluster key regenerated");
            return Ok(super::request_charge::metadata_response(
                RegenerateKeyResponse { kind, key },
            ));
        }
        // Writes and fsyncs the key file.
        let key = tokio::task::spawn_blocking(move || {
            auth.keys().ok_or(KeyAdminError::NoKeys)?.regenerate(slot)
        })
        .await
        .map_err(|e| Status::internal(format!("key task failed: {e}")))??;
        tracing::info!(key = %slot, "key regenerated");
        Ok(super::request_charge::metadata_response(
            RegenerateKeyResponse { kind, key },
        ))
    }

    async fn create_resource_token(
        &self,
        request: Request<CreateResourceTokenRequest>,
    ) -> Result<Response<ResourceTokenProto>, Status> {
        let caller = caller(&self.auth, &request)?;
        // About the account: no token may, and no resource is consulted.
        caller.allow(Action::Manage, Target::Account, &NoResources)?;
        let keys = self.auth.keys().ok_or(KeyAdminError::NoKeys)?;
        // The key the caller was checked with: the token is signed with it, never with a key
        // that replaced it since.
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| bearer(v).ok())
            .map(str::to_owned);
        let Principal::Key(minted_by) = caller else {
            // `allow` let through only read-write keys, or everyone on an open server.
            return Err(KeyAdminError::NoKeys.into());
        };
        let CreateResourceTokenRequest {
            database,
            collection,
            partition_key,
            permission,
            ttl_seconds,
        } = request.into_inner();
        // The token is bound to the database and collection there are now, by uid: it grants
        // nothing on others created later under the same names.
        let engine = self.engine.get().map_err(to_status)?;
        let database_uid = engine
            .get_database(&convert::database_id(&database).map_err(to_status)?)
            .map_err(to_status)?;
        let (collection, collection_uid) = if collection.is_empty() {
            (None, None)
        } else {
            let info = engine
                .get_collection(
                    &convert::collection_path(&database, &collection).map_err(to_status)?,
                )
                .map_err(to_status)?;
            (Some(collection), Some(info.uid))
        };
        let partition_key = convert::partition_key_value(partition_key).map_err(to_status)?;
        if partition_key.is_some() && collection.is_none() {
            return Err(to_status(InvalidInput::MissingField {
                field: "collection",
                hint: "a token scoped to a partition names its collection",
            }));
        }
        let write = match TokenPermission::try_from(permission) {
            Ok(TokenPermission::Unspecified | TokenPermission::Read) => false,
            Ok(TokenPermission::All) => true,
            Err(_) => {
                return Err(to_status(InvalidInput::UnknownEnumValue {
                    field: "permission",
                    value: permission,
                }));
            }
        };
        let secs = ttl_seconds.unwrap_or(DEFAULT_TOKEN_SECS);
        if !(1..=MAX_TOKEN_SECS).contains(&secs) {
            return Err(to_status(InvalidInput::TokenTtl {
                value: secs,
                max: MAX_TOKEN_SECS,
            }));
        }
        let expires_at = self.auth.now() + u64::from(secs) * 1000;
        let key = presented
            .filter(|k| keys.slot_of(k) == Some(minted_by))
            .ok_or(Denied::UnknownKey)?;
        let token = ResourceToken {
            minted_by,
            database,
            database_uid,
            collection,
            collection_uid,
            partition_key,
            write,
            expires_at,
        }
        .mint(&key);
        Ok(super::request_charge::metadata_response(
            ResourceTokenProto {
                token,
                expires_at: Some(convert::timestamp(expires_at)),
            },
        ))
    }

    async fn get_partition_map(
        &self,
        request: Request<GetPartitionMapRequest>,
    ) -> Result<Response<PartitionMap>, Status> {
        let caller = caller(&self.auth, &request)?;
        let engine = self.engine.get().map_err(to_status)?;
        caller.allow(Action::Read, Target::Account, &engine)?;
        let partitions = engine.shard_count() as u32;
        let placement = match engine.placement() {
            crate::engine::Placement::Xxh3 => "xxh3-64",
            crate::engine::Placement::Format1 => "format-1",
        };
        let (node, nodes, leases, members) = match &self.cluster {
            Some(cluster) => (
                cluster.node().to_string(),
                cluster.nodes().await?,
                cluster.leases(partitions).await?,
                cluster.members().await?,
            ),
            None => (
                "local".to_string(),
                Vec::new(),
                vec![("local".to_string(), 0); partitions as usize],
                Vec::new(),
            ),
        };
        let status = ClusterStatus::of(partitions, &members);
        let owners = leases
            .into_iter()
            .enumerate()
            .map(|(p, (owner, epoch))| PartitionOwner {
                partition: p as u32,
                standbys: status.standbys(p, &owner),
                owner,
                epoch,
                log_end: engine.log_end(p),
                served_here: engine.serves(p),
                log_diverged: engine.diverged(p).unwrap_or_default(),
            })
            .collect();
        Ok(super::request_charge::metadata_response(PartitionMap {
            node,
            partitions,
            placement: placement.to_string(),
            nodes: nodes
                .into_iter()
                .map(|(id, address)| status.node(id, address))
                .collect(),
            owners,
        }))
    }
}

/// What the members' last heartbeats say of the partitions' copies
/// ([`crate::cluster_report`]).
struct ClusterStatus<'a> {
    members: &'a [(String, Vec<PartitionCopy>)],
    /// By partition: where its log ends, as the node serving it last reported.
    log_ends: Vec<Option<(&'a str, u64)>>,
}

impl<'a> ClusterStatus<'a> {
    fn of(partitions: u32, members: &'a [(String, Vec<PartitionCopy>)]) -> Self {
        let mut log_ends = vec![None; partitions as usize];
        for (node, copies) in members {
            for copy in copies {
                if let PartitionCopy::Serves { partition, log_end } = *copy
                    && let Some(end) = log_ends.get_mut(partition as usize)
                {
                    *end = Some((node.as_str(), log_end));
                }
            }
        }
        ClusterStatus { members, log_ends }
    }

    /// A node of the directory, with what its last heartbeat said.
    fn node(&self, id: String, address: String) -> ClusterNode {
        let member = self.members.iter().find(|(m, _)| *m == id);
        let copies = member.map_or(&[][..], |(_, c)| c.as_slice());
        let serves = copies
            .iter()
            .filter(|c| matches!(c, PartitionCopy::Serves { .. }))
            .count();
        ClusterNode {
            id,
            address,
            live: member.is_some(),
            serves: serves as u32,
            follows: (copies.len() - serves) as u32,
        }
    }

    /// The nodes following partition `p` (other than its owner), in id order.
    fn standbys(&self, p: usize, owner: &str) -> Vec<Standby> {
        let end = self.log_ends[p].filter(|(node, _)| *node == owner);
        self.members
            .iter()
            .filter(|(node, _)| node != owner)
            .filter_map(|(node, copies)| {
                copies.iter().find_map(|c| match *c {
                    PartitionCopy::Follows {
                        partition,
                        applied,
                        lag_ms,
                    } if partition as usize == p => Some(Standby {
                        node: node.clone(),
                        applied,
                        behind: end.map_or(0, |(_, end)| end.saturating_sub(applied)),
                        lag_ms,
                    }),
                    _ => None,
                })
            })
            .collect()
    }
}
