//! gRPC clients for a test's `mayfly`, over one connection.

use mayfly_proto::v1::{
    PartitionKey,
    client::{AdminClient, CollectionsClient, DatabasesClient, DocumentsClient},
    oneofs::PartitionKeyKind,
};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;

use super::Mayfly;

/// The service clients of one server.
pub(crate) struct Clients {
    pub(crate) databases: DatabasesClient<Channel>,
    pub(crate) collections: CollectionsClient<Channel>,
    pub(crate) documents: DocumentsClient<Channel>,
    pub(crate) health: HealthClient<Channel>,
    pub(crate) admin: AdminClient<Channel>,
}

pub(crate) async fn connect(server: &Mayfly) -> Clients {
    let channel = Endpoint::from_shared(server.url())
        .expect("valid uri")
        .connect()
        .await
        .expect("connects to mayfly");
    Clients {
        databases: DatabasesClient::new(channel.clone()),
        collections: CollectionsClient::new(channel.clone()),
        documents: DocumentsClient::new(channel.clone()),
        admin: AdminClient::new(channel.clone()),
        health: HealthClient::new(channel),
    }
}

/// A partition key holding one string.
pub(crate) fn string_pk(value: &str) -> PartitionKey {
    PartitionKey {
        kind: Some(PartitionKeyKind::Value(prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(value.to_owned())),
        })),
    }
}
