//! gRPC clients for a test's `mayfly`, over one connection.

use mayfly_proto::v1::{
    client::{AdminClient, CollectionsClient, DatabasesClient, DocumentsClient},
    oneofs::PartitionKeyKind,
};
use mayfly_proto::{
    json::{JsonObject, JsonValue},
    v1::{CreateCollectionRequest, CreateDatabaseRequest, CreateDocumentRequest, PartitionKey},
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
    clients(channel)
}

/// A connection to `url` whose requests time out after 10 s (a killed server's load notices).
pub(crate) async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned())
        .expect("url")
        .timeout(std::time::Duration::from_secs(10))
        .connect()
        .await
        .expect("connects")
}

/// The service clients over `channel`.
pub(crate) fn clients(channel: Channel) -> Clients {
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
        kind: Some(PartitionKeyKind::Value(JsonValue::new(
            serde_json::Value::String(value.to_owned()),
        ))),
    }
}

/// Database `d` and its collection `c` (partition key `/pk`, TTL off).
pub(crate) async fn database_and_collection(c: &mut Clients) {
    c.databases
        .create_database(CreateDatabaseRequest {
            id: "d".into(),
            ..Default::default()
        })
        .await
        .expect("database");
    c.collections
        .create_collection(CreateCollectionRequest {
            database: "d".into(),
            id: "c".into(),
            partition_key_path: "/pk".into(),
            ..Default::default()
        })
        .await
        .expect("collection");
}

/// Database `d`, collection `c` (partition key `/pk`) and `count` documents `doc-000`, … in
/// partitions `p0`..`p2`, each padded with `pad` bytes of text.
pub(crate) async fn seeded(c: &mut Clients, count: usize, pad: usize) {
    database_and_collection(c).await;
    let padding = "x".repeat(pad);
    create_all(
        c,
        (0..count).map(|i| {
            serde_json::json!({
                "id": format!("doc-{i:03}"), "pk": format!("p{}", i % 3), "n": i, "pad": padding,
            })
        }),
    )
    .await;
}

/// Creates each of `bodies` (JSON objects) in `d/c`.
pub(crate) async fn create_all(
    c: &mut Clients,
    bodies: impl IntoIterator<Item = serde_json::Value>,
) {
    for body in bodies {
        let serde_json::Value::Object(body) = body else {
            panic!("a document is an object: {body}")
        };
        c.documents
            .create_document(CreateDocumentRequest {
                database: "d".into(),
                collection: "c".into(),
                body: Some(JsonObject::new(body)),
                ..Default::default()
            })
            .await
            .expect("document");
    }
}

/// `message` with `authorization: Bearer <credential>`, if a credential is given.
pub(crate) fn with<T>(credential: Option<&str>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(credential) = credential {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {credential}").parse().expect("ascii"),
        );
    }
    request
}
