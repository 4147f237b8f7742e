//! Running a future to completion on the calling thread. Catalog changes are synchronous (the
//! gRPC edge calls them on a blocking thread) yet wait for durability through the same futures
//! as requests; this is the few lines that bridge the two.

use std::{
    future::Future,
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Wake, Waker},
    thread::{self, Thread},
};

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` until it is ready, parking the thread in between.
pub(super) fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        // A wake before this park leaves a token, so no wake-up is lost.
        thread::park();
    }
}
