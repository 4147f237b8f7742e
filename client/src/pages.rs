//! The pages of a server stream (feed or query), each awaited under the request timeout.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::Streaming;

use crate::{client::Client, error::Error};

/// A response stream whose pages each must come within the client's request timeout.
pub(crate) struct Pages<M> {
    stream: Streaming<M>,
    client: Client,
    /// Running while a page is awaited; a fresh one for each page.
    deadline: Option<Pin<Box<Sleep>>>,
    /// After a timeout the stream is left as it is: it ends.
    ended: bool,
}

impl<M> std::fmt::Debug for Pages<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pages").field("ended", &self.ended).finish()
    }
}

impl<M> Pages<M> {
    pub(crate) fn new(stream: Streaming<M>, client: Client) -> Self {
        Pages {
            stream,
            client,
            deadline: None,
            ended: false,
        }
    }

    /// The next page, `None` after the last.
    pub(crate) async fn next(&mut self) -> Result<Option<M>, Error> {
        std::future::poll_fn(|cx| self.poll_page(cx))
            .await
            .transpose()
    }

    pub(crate) fn poll_page(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<M, Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(limit) = self.client.request_timeout() {
            let deadline = self
                .deadline
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
            if deadline.as_mut().poll(cx).is_ready() {
                self.deadline = None;
                self.ended = true;
                return Poll::Ready(Some(Err(Error::timeout(limit))));
            }
        }
        match Pin::new(&mut self.stream).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(page) => {
                self.deadline = None;
                Poll::Ready(page.map(|p| p.map_err(|status| self.client.error(status))))
            }
        }
    }
}
