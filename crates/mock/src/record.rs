//! Call records: what each request asked for and what the mock did, for test assertions.
//!
//! A record is created when the request's body has been read and is completed when the mock has
//! sent its last byte. If the response (handler future or body stream) is dropped before that —
//! the client hung up, or a deadline in the router closed the connection — a drop guard stamps
//! `cancelled_at` and the number of content tokens already streamed (field cases 13, 17, 21).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// Usage the mock put on the wire for one call, normalised to four counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UsageRecord {
    /// All prompt tokens, cached or not (OpenAI `prompt_tokens`).
    pub prompt_tokens: u64,
    /// Prompt tokens read from the prompt cache.
    pub cached_tokens: u64,
    /// Prompt tokens written to the cache (Anthropic `cache_creation_input_tokens`).
    pub cache_creation_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

/// One request as the mock saw and answered it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallRecord {
    /// Sequence number from 0.
    pub seq: u64,
    /// Arrival time on the mock's clock (since start or the last reset).
    pub at: Duration,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Requested model ("" when absent).
    pub model: String,
    /// Whether the request asked to stream.
    pub stream: bool,
    /// HTTP status sent (0 when no headers were ever sent).
    pub status: u16,
    /// `stream_options.include_usage` was true.
    pub include_usage_requested: bool,
    /// Value of the configured project header.
    pub project: Option<String>,
    /// Last 4 characters of the API key used (a Bedrock request: of its SigV4 access key id; a
    /// Vertex request: of its bearer token), to tell credentials apart without storing them.
    pub key_suffix: Option<String>,
    /// The W3C `traceparent` header the request carried, if any (what a tracing router passed on).
    pub traceparent: Option<String>,
    /// Labels of the faults applied (`rate_limited`, `latency`, ...).
    pub fault: Vec<String>,
    /// When the client went away before the mock finished, on the mock's clock.
    pub cancelled_at: Option<Duration>,
    /// Content tokens sent before the end or the cancellation.
    pub tokens_streamed: u64,
    /// Usage that reached the wire, if any.
    pub usage: Option<UsageRecord>,
    /// When the mock sent its last byte (or gave up), on the mock's clock.
    pub finished_at: Option<Duration>,
}

#[derive(Debug)]
pub(crate) struct Log {
    pub(crate) epoch: Instant,
    /// Bumped by every reset so guards of older calls do not touch newer records.
    generation: u64,
    /// Retained records, oldest first; `calls[0].seq == first_seq`.
    calls: VecDeque<CallRecord>,
    first_seq: u64,
    /// Records kept at most; older ones are dropped so long runs stay bounded.
    limit: usize,
}

/// Shared call log.
#[derive(Debug, Clone)]
pub(crate) struct Recorder(Arc<Mutex<Log>>);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep serving it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorder {
    pub(crate) fn new(limit: usize) -> Self {
        Self(Arc::new(Mutex::new(Log {
            epoch: Instant::now(),
            generation: 0,
            calls: VecDeque::new(),
            first_seq: 0,
            limit: limit.max(1),
        })))
    }

    /// Time on the mock's clock.
    pub(crate) fn now(&self) -> Duration {
        lock(&self.0).epoch.elapsed()
    }

    pub(crate) fn reset(&self) {
        let mut log = lock(&self.0);
        log.epoch = Instant::now();
        log.generation += 1;
        log.calls.clear();
        log.first_seq = 0;
    }

    pub(crate) fn calls(&self) -> Vec<CallRecord> {
        lock(&self.0).calls.iter().cloned().collect()
    }

    /// All calls since start or reset, including records dropped by the limit.
    pub(crate) fn count(&self) -> usize {
        let log = lock(&self.0);
        usize::try_from(log.first_seq).unwrap_or(usize::MAX) + log.calls.len()
    }

    /// Starts a record and returns the guard that finishes it.
    pub(crate) fn start(&self, mut rec: CallRecord) -> CallGuard {
        let mut log = lock(&self.0);
        let seq = log.first_seq + log.calls.len() as u64;
        rec.seq = seq;
        rec.at = log.epoch.elapsed();
        log.calls.push_back(rec);
        while log.calls.len() > log.limit {
            log.calls.pop_front();
            log.first_seq += 1;
        }
        let generation = log.generation;
        CallGuard {
            rec: self.clone(),
            seq,
            generation,
            tokens: 0,
            done: false,
        }
    }

    fn update(&self, seq: u64, generation: u64, f: impl FnOnce(&mut CallRecord, Duration)) {
        let mut log = lock(&self.0);
        if log.generation != generation || seq < log.first_seq {
            return; // the record is gone (admin reset, or dropped by the limit)
        }
        let now = log.epoch.elapsed();
        let index = usize::try_from(seq - log.first_seq).unwrap_or(usize::MAX);
        if let Some(rec) = log.calls.get_mut(index) {
            f(rec, now);
        }
    }
}

/// Finishes a call record; dropping it unfinished marks the call cancelled.
#[derive(Debug)]
pub(crate) struct CallGuard {
    rec: Recorder,
    seq: u64,
    generation: u64,
    tokens: u64,
    done: bool,
}

impl CallGuard {
    pub(crate) fn set_status(&self, status: u16) {
        self.rec
            .update(self.seq, self.generation, |r, _| r.status = status);
    }

    pub(crate) fn add_fault_labels(&self, labels: &[&'static str]) {
        self.rec.update(self.seq, self.generation, |r, _| {
            r.fault.extend(labels.iter().map(|l| (*l).to_owned()));
        });
    }

    pub(crate) fn token_sent(&mut self) {
        self.tokens += 1;
    }

    pub(crate) fn set_tokens(&mut self, n: u64) {
        self.tokens = n;
    }

    pub(crate) fn usage_sent(&self, usage: UsageRecord) {
        self.rec
            .update(self.seq, self.generation, |r, _| r.usage = Some(usage));
    }

    /// The mock finished (normally, or by its own injected cut).
    pub(crate) fn finish(mut self) {
        self.done = true;
        let tokens = self.tokens;
        self.rec.update(self.seq, self.generation, |r, now| {
            r.tokens_streamed = tokens;
            r.finished_at = Some(now);
        });
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.done {
            let tokens = self.tokens;
            self.rec.update(self.seq, self.generation, |r, now| {
                r.tokens_streamed = tokens;
                r.cancelled_at = Some(now);
                r.finished_at = Some(now);
            });
        }
    }
}
