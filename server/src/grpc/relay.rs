//! Relaying a stream of pages from node to node, in a cluster: each node computes the pages of
//! the partitions it serves, its stream ending where they end (a *handoff*), and the node the
//! client called goes on from that stream's last continuation at the next one's node. The
//! client sees one stream, whose pages are as full as a single node's: a page cut short by a
//! handoff is filled from the next node before it is sent.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use futures_util::StreamExt;
use mayfly_proto::v1::{QueryMetrics, QueryPage, ReadFeedPage};
use tonic::Status;

use super::{request_charge::sum_units, stream::PageStream};

/// How long filling a page cut short by a handoff may take, as a node's own page ends on time
/// (`PAGE_TIME_LIMIT`): past it, the page is sent as it is.
const FILL_TIME: Duration = Duration::from_secs(2);

/// A page of a relayed stream.
pub(super) trait Continued: prost::Message + Send + 'static {
    /// Where the stream goes on after it (empty: it ends).
    fn continuation(&self) -> &str;
    /// Results or documents it holds.
    fn len(&self) -> usize;
    /// It, followed by `next`, the page that went on from its continuation.
    fn extend(&mut self, next: Self);
}

impl Continued for QueryPage {
    fn continuation(&self) -> &str {
        &self.continuation
    }

    fn len(&self) -> usize {
        self.results.len()
    }

    fn extend(&mut self, next: Self) {
        self.results.extend(next.results);
        self.continuation = next.continuation;
        self.request_charge = sum_units(self.request_charge, next.request_charge);
        let m = self.metrics.get_or_insert_with(QueryMetrics::default);
        if let Some(n) = next.metrics {
            m.documents_examined += n.documents_examined;
            m.index_entries_examined += n.index_entries_examined;
            m.results_returned += n.results_returned;
            m.index_used |= n.index_used;
            if m.index.is_empty() {
                m.index = n.index;
            }
        }
    }
}

impl Continued for ReadFeedPage {
    fn continuation(&self) -> &str {
        &self.continuation
    }

    fn len(&self) -> usize {
        self.documents.len()
    }

    fn extend(&mut self, next: Self) {
        self.documents.extend(next.documents);
        self.continuation = next.continuation;
        self.request_charge = sum_units(self.request_charge, next.request_charge);
    }
}

/// The pages from `token` on, `page_size` at most each, from `hop(token, size)`: the pages, of
/// `size` at most, of the node serving where `token` starts, up to that node's last. A page is
/// filled across a handoff while it holds less than half of `page_bytes` (a node's next page
/// adds at most about `page_bytes`, so a filled page stays far below a message's limit), and a
/// page left empty is not sent (the page before takes its continuation). The first hop is
/// opened before answering, so that a request refused there fails the call itself.
pub(super) async fn relay<M, H, F>(
    token: Option<String>,
    page: (usize, usize),
    hop: H,
) -> Result<PageStream<M>, Status>
where
    M: Continued,
    H: Fn(Option<String>, usize) -> F + Send + Sync + 'static,
    F: Future<Output = Result<PageStream<M>, Status>> + Send,
{
    let stream = hop(token, page.0).await?;
    let mut source = Pages {
        stream: Some(stream),
        held: None,
        page,
        hop,
    };
    let (pages, out) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        // A client that left ends the hop too, even one whose node stopped answering.
        let mut ready = tokio::select! {
            page = source.next() => page,
            () = pages.closed() => return,
        };
        loop {
            let page = match ready {
                None => return,
                Some(Err(status)) => {
                    let _ = pages.send(Err(status)).await;
                    return;
                }
                Some(Ok(page)) => page,
            };
            if page.continuation().is_empty() {
                let _ = pages.send(Ok(page)).await;
                return;
            }
            let mut page = page;
            // The page after it, skipping empty ones (their continuations taken over).
            ready = loop {
                let next = tokio::select! {
                    next = source.next() => next,
                    () = pages.closed() => return,
                };
                match next {
                    Some(Ok(empty)) if empty.len() == 0 => {
                        // It goes on where the empty page ends.
                        page.extend(empty);
                        if page.continuation().is_empty() {
                            break None;
                        }
                    }
                    other => break other,
                }
            };
            if pages.send(Ok(page)).await.is_err() {
                return;
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out)))
}

/// The pages of a relayed stream, each hop's last filled from the hops after it.
struct Pages<M, H> {
    /// The hop read now; `None` once the stream ended.
    stream: Option<PageStream<M>>,
    /// A page read ahead: whether it is its hop's last is known once the next arrives.
    held: Option<M>,
    /// (page size, page bytes).
    page: (usize, usize),
    hop: H,
}

impl<M, H, F> Pages<M, H>
where
    M: Continued,
    H: Fn(Option<String>, usize) -> F,
    F: Future<Output = Result<PageStream<M>, Status>>,
{
    /// The next page; `None` after the last. After an error, nothing more.
    async fn next(&mut self) -> Option<Result<M, Status>> {
        loop {
            let stream = self.stream.as_mut()?;
            match stream.next().await {
                Some(Ok(page)) => {
                    if let Some(before) = self.held.replace(page) {
                        return Some(Ok(before));
                    }
                }
                Some(Err(status)) => {
                    self.stream = None;
                    return Some(Err(status));
                }
                None => {
                    self.stream = None;
                    let Some(last) = self.held.take() else {
                        return Some(Err(Status::internal("a node sent no page")));
                    };
                    if last.continuation().is_empty() {
                        return Some(Ok(last));
                    }
                    // A handoff: filled from the nodes after, then the stream goes on where the
                    // filled page ends.
                    let filled = match fill(last, self.page, &self.hop).await {
                        Ok(page) => page,
                        Err(status) => return Some(Err(status)),
                    };
                    if !filled.continuation().is_empty() {
                        let from = Some(filled.continuation().to_owned());
                        match (self.hop)(from, self.page.0).await {
                            Ok(stream) => self.stream = Some(stream),
                            Err(status) => return Some(Err(status)),
                        }
                    }
                    return Some(Ok(filled));
                }
            }
        }
    }
}

/// `page`, the last of a hop, filled to `page_size` from the first pages of the hops after it
/// (each asked for what is missing), until it is full (or holds half of `page_bytes`), the
/// stream ends, or [`FILL_TIME`] has passed.
async fn fill<M, H, F>(
    mut page: M,
    (page_size, page_bytes): (usize, usize),
    hop: &H,
) -> Result<M, Status>
where
    M: Continued,
    H: Fn(Option<String>, usize) -> F,
    F: Future<Output = Result<PageStream<M>, Status>>,
{
    let started = Instant::now();
    while page.len() < page_size
        && page.encoded_len() < page_bytes / 2
        && !page.continuation().is_empty()
        && started.elapsed() < FILL_TIME
    {
        let from = page.continuation().to_owned();
        let mut next = hop(Some(from.clone()), page_size - page.len()).await?;
        let more = next
            .next()
            .await
            .ok_or_else(|| Status::internal("a node sent no page"))??;
        if more.continuation() == from {
            // A hop that made no progress would be asked again forever.
            return Err(Status::internal("a page handed off where it started"));
        }
        page.extend(more);
    }
    Ok(page)
}
