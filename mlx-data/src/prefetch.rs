//! Background prefetching: a thread fills a bounded queue with upcoming batches.

use crate::batch::Batch;
use crate::error::{DataError, Result};
use crate::loader::{DataLoader, LoaderState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

type Item = Result<(Batch, LoaderState)>;

/// Runs a [`DataLoader`] on a background thread, `depth` batches ahead.
///
/// [`Prefetcher::state`] is the state after the last batch *delivered*, so saving
/// it and restoring a new loader from it resumes exactly where the consumer is,
/// regardless of how far ahead the thread had read.
#[derive(Debug)]
pub struct Prefetcher {
    rx: Option<Receiver<Item>>,
    handle: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    state: LoaderState,
    timeout: Duration,
}

impl Prefetcher {
    /// Starts the thread with a queue of `depth` batches (at least 1) and a default
    /// 60 s deadline per batch.
    pub fn spawn(loader: DataLoader, depth: usize) -> Result<Prefetcher> {
        Self::with_timeout(loader, depth, Duration::from_secs(60))
    }

    /// Like [`Prefetcher::spawn`] with an explicit per-batch deadline.
    pub fn with_timeout(
        mut loader: DataLoader,
        depth: usize,
        timeout: Duration,
    ) -> Result<Prefetcher> {
        let (tx, rx) = sync_channel::<Item>(depth.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let state = loader.state();
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("mlx-data-prefetch".into())
            .spawn(move || produce(&mut loader, &tx, &flag))
            .map_err(|e| DataError::PrefetchStopped(format!("cannot spawn thread: {e}")))?;
        Ok(Prefetcher {
            rx: Some(rx),
            handle: Some(handle),
            stop,
            state,
            timeout,
        })
    }

    /// The next batch, or an error if none arrives within the deadline.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let rx = self
            .rx
            .as_ref()
            .ok_or_else(|| DataError::PrefetchStopped("already shut down".into()))?;
        match rx.recv_timeout(self.timeout) {
            Ok(Ok((batch, state))) => {
                self.state = state;
                Ok(batch)
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Err(DataError::PrefetchTimeout(self.timeout)),
            Err(RecvTimeoutError::Disconnected) => Err(DataError::PrefetchStopped(
                "the loader thread exited (it panicked or hit an error earlier)".into(),
            )),
        }
    }

    /// The state after the last delivered batch.
    pub fn state(&self) -> LoaderState {
        self.state.clone()
    }
}

fn produce(loader: &mut DataLoader, tx: &SyncSender<Item>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let item = loader.next_batch().map(|b| (b, loader.state()));
        let failed = item.is_err();
        // Blocks while the queue is full; returns an error at once when the
        // receiver is dropped, which is how `Drop` stops this thread.
        if tx.send(item).is_err() || failed {
            return;
        }
    }
}

impl Iterator for Prefetcher {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_batch())
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.rx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
