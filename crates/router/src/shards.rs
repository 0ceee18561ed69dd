//! Connection shards: client connections served on single-threaded runtimes, one per core.
//!
//! On the shared work-stealing runtime a request through the router wakes tasks on other
//! worker threads at every step: the client connection's task, the upstream connection's task
//! that the HTTP client spawns, and the parked worker that the wake-up has to unpark (a futex
//! and a context switch each). On a 2-core machine that scheduling cost was about half of the
//! router's CPU per request (`docs/benchmarks.md`, issue 16). A shard is an OS thread running
//! a current-thread tokio runtime; the accept loop hands each accepted connection to the next
//! shard, and everything that connection's requests spawn (upstream connections, streamed
//! bodies) runs on the same thread, so a request's tasks wake each other without a thread
//! hop; each shard sends upstream through pools of its own
//! ([`crate::upstream::enter_shard`]). This is the worker-per-core model of nginx and of thread-per-core servers such as
//! Seastar. The control loop, watchers and the broker's pump stay on the shared runtime; the
//! state they share with requests is `Send + Sync` already.
//!
//! The cost: a connection stays on its shard, so one busy shard cannot hand work to an idle
//! one (no work stealing between shards). Requests do bounded, linear work and the CPU-heavy
//! steps (tokenizer load) run on the blocking pool, so a shard is never held for long.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// `n` shard threads, each driving one current-thread runtime until the set is dropped.
#[derive(Debug)]
pub struct Shards {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    next: AtomicUsize,
}

impl Shards {
    /// Starts `n` shard threads (at least one), named `switchyard-io-<i>`.
    ///
    /// # Errors
    /// The OS refused a thread, or a runtime failed to build (its I/O driver).
    pub fn start(n: usize) -> io::Result<Shards> {
        let mut handles = Vec::with_capacity(n.max(1));
        let mut stops = Vec::with_capacity(n.max(1));
        for i in 0..n.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            std::thread::Builder::new()
                .name(format!("switchyard-io-{i}"))
                .spawn(move || {
                    crate::upstream::enter_shard(i);
                    // Tasks still running when the set is dropped (a detached settlement, an
                    // idle upstream connection) are cancelled with the runtime.
                    let _ = runtime.block_on(stopped);
                })?;
        }
        Ok(Shards {
            handles,
            stops,
            next: AtomicUsize::new(0),
        })
    }

    /// The runtime of the shard that gets the next connection (round robin).
    pub fn next(&self) -> &Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        &self.handles[i]
    }

    /// How many shards there are.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Always false: a set has at least one shard.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_rotate_over_the_shards_and_their_tasks_run_there() {
        let shards = Shards::start(2).unwrap();
        assert_eq!(shards.len(), 2);
        let mut names = Vec::new();
        for _ in 0..4 {
            let name = shards
                .next()
                .spawn(async {
                    // A task spawned from a shard's task stays on that shard.
                    tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                        .await
                        .unwrap()
                })
                .await
                .unwrap();
            names.push(name.unwrap());
        }
        assert_eq!(
            names,
            [
                "switchyard-io-0",
                "switchyard-io-1",
                "switchyard-io-0",
                "switchyard-io-1"
            ]
        );
    }

    #[tokio::test]
    async fn a_dropped_set_stops_its_threads_runtimes() {
        let shards = Shards::start(1).unwrap();
        let handle = shards.next().clone();
        drop(shards);
        // The runtime shuts down once its thread's block_on returns; a spawn after that
        // never runs (its JoinHandle reports cancellation).
        let mut cancelled = false;
        for _ in 0..100 {
            if handle.spawn(async {}).await.is_err() {
                cancelled = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            cancelled,
            "the shard's runtime still runs tasks after the drop"
        );
    }
}
