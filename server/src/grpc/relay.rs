//! Relaying a stream of pages from node to node, in a cluster: each node computes the pages of
//! the partitions it serves, its stream ending where they end (a *handoff*), and the node the
//! client called goes on from that stream's last continuation at the next one's node. The
//! client sees one stream.

use std::future::Future;

use futures_util::StreamExt;
use mayfly_proto::v1::{QueryPage, ReadFeedPage};
use tonic::Status;

use super::stream::PageStream;

/// A page of a relayed stream: where the stream goes on after it (empty: it ends).
pub(super) trait Continued: Send + 'static {
    fn continuation(&self) -> &str;
}

impl Continued for QueryPage {
    fn continuation(&self) -> &str {
        &self.continuation
    }
}

impl Continued for ReadFeedPage {
    fn continuation(&self) -> &str {
        &self.continuation
    }
}

/// The pages from `token` on, each node's from `hop` (the pages of the node serving where a
/// continuation starts, up to its last). The first hop is opened before answering, so that a
/// request refused there fails the call itself.
pub(super) async fn relay<M, H, F>(token: Option<String>, hop: H) -> Result<PageStream<M>, Status>
where
    M: Continued,
    H: Fn(Option<String>) -> F + Send + 'static,
    F: Future<Output = Result<PageStream<M>, Status>> + Send,
{
    let mut stream = hop(token.clone()).await?;
    let (pages, out) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let mut from = token;
        loop {
            let mut last = None;
            loop {
                // A client that left ends the hop too, even one whose node stopped answering.
                let page = tokio::select! {
                    page = stream.next() => page,
                    () = pages.closed() => return,
                };
                let Some(page) = page else { break };
                let failed = page.is_err();
                if let Ok(page) = &page {
                    last = Some(page.continuation().to_owned());
                }
                if pages.send(page).await.is_err() || failed {
                    return;
                }
            }
            let next = match last {
                Some(next) if !next.is_empty() => next,
                _ => return,
            };
            if from.as_deref() == Some(next.as_str()) {
                // A hop that made no progress would be asked again forever.
                let stuck = Status::internal("a page handed off where it started");
                let _ = pages.send(Err(stuck)).await;
                return;
            }
            from = Some(next);
            stream = match hop(from.clone()).await {
                Ok(stream) => stream,
                Err(status) => {
                    let _ = pages.send(Err(status)).await;
                    return;
                }
            };
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out)))
}
