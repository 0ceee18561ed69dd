//! The Redis backend: reservations and settlements run as Lua scripts (EVALSHA through
//! [`redis::Script`], which loads the script on `NOSCRIPT`), all keys under one hash tag.
//!
//! Reservations and settlements are batched (group commit): each kind has a task that sends
//! whatever is waiting as one script call as soon as fewer than [`MAX_IN_FLIGHT`] calls of its
//! kind are out, at most [`MAX_BATCH`] items each. An idle store therefore sends every item
//! alone at once (no added latency), and a loaded one amortises the script call, the `TIME`
//! read and the `HMGET`/`HSET` of the shared bucket hash over the batch: a bucket named by
//! several items is read and written once, debited or credited by each in item order. Items
//! keep their own answers; a failed or late call fails every item in it. Redis runs each
//! script atomically, so a batch is as if its items had run one after another.
//!
//! Key layout (prefix `p`): `{p}:buckets` hash of token and window states (field
//! `{p}:b:<bucket key>`, so one `HMGET` reads all buckets of a reservation and one `HSET`
//! writes them), `{p}:c:<bucket key>` sorted set of reservation ids scored by expiry
//! (concurrency),
//! `{p}:r:<reservation id>` string `amount:epoch,...` of what was debited per bucket (expires with the
//! reservation), `{p}:x:<reservation id>` tombstone of a cancelled id (a reservation script
//! that finds it debits nothing), `{p}:signals` hash of shared deadlines, published on channel
//! `{p}:signals`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::aio::ConnectionManager;
use redis::{Script, ScriptInvocation, Value};
use switchyard_core::quota::{BucketSpec, RateFigures, Rule};
use tokio::sync::{mpsc, oneshot};

use crate::StoreError;

const PRELUDE: &str = include_str!("lua/buckets.lua");
const TWO_POW_53: u128 = 1 << 53;

/// Arguments per bucket in the scripts (`GROUP` in `lua/buckets.lua`).
const GROUP: usize = 8;

/// Most items in one batched script call (a few thousand arguments at five buckets each).
pub(crate) const MAX_BATCH: usize = 64;

/// Batched calls of one kind (reservations or settlements) out at once per store. More than
/// one keeps the connection's pipeline busy while a batch is on the wire; few enough that
/// batches form under load.
pub(crate) const MAX_IN_FLIGHT: usize = 1;

/// Items waiting for a batch, per kind; a full queue makes callers wait (within their op
/// timeout).
const QUEUE_DEPTH: usize = 4096;

/// What the reservation script answered.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Debited everywhere; each bucket's figures after the debit, in request order.
    Admitted(Vec<RateFigures>),
    /// Nothing debited; the binding bucket.
    Refused(Refused),
    /// Nothing debited: the id had been cancelled before the script ran (its tombstone).
    Cancelled,
}

/// The binding bucket of a refused reservation, as the script reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused {
    /// 0-based position in the bucket list.
    pub(crate) index: usize,
    /// 0 on release, 1 after `wait_us`, 2 never.
    pub(crate) wait_kind: i64,
    pub(crate) wait_us: i64,
    pub(crate) limit: i64,
    pub(crate) remaining: i64,
    pub(crate) reset_us: i64,
}

#[derive(Debug)]
pub(crate) struct Remote {
    conn: ConnectionManager,
    tag: String,
    state_key: String,
    pub(crate) channel: String,
    signals_key: String,
    reserve: Batcher,
    settle: Batcher,
    figures: Script,
    signal: Script,
    renew: Script,
    idempotency: Script,
    op_timeout: Duration,
    instance: u64,
    seq: AtomicU64,
}

/// What one bucket is asked in a script: `amount` is the debit (reserve) or the units really
/// used (settle; `None` keeps the estimate).
pub(crate) struct Ask<'a> {
    pub(crate) spec: &'a BucketSpec,
    pub(crate) amount: Option<u64>,
}

impl Remote {
    pub(crate) fn new(conn: ConnectionManager, prefix: &str, op_timeout: Duration) -> Self {
        let script = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
        Remote {
            conn: conn.clone(),
            tag: format!("{{{prefix}}}"),
            state_key: format!("{{{prefix}}}:buckets"),
            channel: format!("{{{prefix}}}:signals"),
            signals_key: format!("{{{prefix}}}:signals"),
            // A reservation whose caller has gone is not sent: its guard has already issued the
            // cancel. A settlement is sent whoever waits for it.
            reserve: Batcher::spawn(
                conn.clone(),
                script(include_str!("lua/reserve.lua")),
                format!("{{{prefix}}}:buckets"),
                op_timeout,
                Abandoned::Skip,
            ),
            settle: Batcher::spawn(
                conn,
                script(include_str!("lua/settle.lua")),
                format!("{{{prefix}}}:buckets"),
                op_timeout,
                Abandoned::Send,
            ),
            figures: script(include_str!("lua/figures.lua")),
            signal: script(include_str!("lua/signal.lua")),
            renew: script(include_str!("lua/renew.lua")),
            // Plain script: it needs none of the bucket arithmetic.
            idempotency: Script::new(include_str!("lua/idempotency.lua")),
            op_timeout,
            instance: rand::random(),
            seq: AtomicU64::new(0),
        }
    }

    /// A reservation id unique across replicas: a random instance number and a counter.
    pub(crate) fn next_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}.{n:x}", self.instance)
    }

    fn bucket_key(&self, spec: &BucketSpec) -> String {
        let kind = if matches!(spec.rule, Rule::Concurrency { .. }) {
            'c'
        } else {
            'b'
        };
        format!("{}:{kind}:{}", self.tag, spec.key)
    }

    fn record_key(&self, id: &str) -> String {
        format!("{}:r:{id}", self.tag)
    }

    fn tomb_key(&self, id: &str) -> String {
        format!("{}:x:{id}", self.tag)
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.op_timeout, inv.invoke_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.op_timeout)),
        }
    }

    /// One batch item: the reservation's record and tombstone keys, its id, `ms` (a ttl) and
    /// its buckets, each with its argument group (the amount in slot 1; see `batch_items` in
    /// `lua/buckets.lua`).
    fn item(
        &self,
        id: &str,
        asks: &[Ask<'_>],
        ms: u64,
        lease: Duration,
        wall: DateTime<Utc>,
    ) -> Item {
        let buckets = asks
            .iter()
            .map(|a| {
                let mut g = group(a, wall);
                if !lease.is_zero() && matches!(a.spec.rule, Rule::Concurrency { .. }) {
                    // The slot lease travels in the concurrency group's first free slot (b+3).
                    g[3] = clamp_i64(millis(lease));
                }
                (self.bucket_key(a.spec), g)
            })
            .collect();
        Item {
            record: self.record_key(id),
            tomb: self.tomb_key(id),
            id: id.to_owned(),
            ms,
            buckets,
        }
    }

    /// Reservations dropped unsent because their caller had stopped waiting.
    pub(crate) fn reservations_skipped(&self) -> u64 {
        self.reserve.stats.skipped.load(Ordering::Relaxed)
    }

    /// `(script calls, items)` sent so far for reservations and for settlements.
    pub(crate) fn batch_stats(&self) -> [(u64, u64); 2] {
        [&self.reserve, &self.settle].map(|b| {
            (
                b.stats.calls.load(Ordering::Relaxed),
                b.stats.items.load(Ordering::Relaxed),
            )
        })
    }

    /// Runs the reservation script; when admitted, the reservation is recorded under `id`.
    /// Concurrency slots are leased for `lease` (renewed by [`Remote::renew`]).
    pub(crate) async fn reserve(
        &self,
        id: &str,
        asks: &[Ask<'_>],
        ttl: Duration,
        lease: Duration,
        wall: DateTime<Utc>,
    ) -> Result<Reply, StoreError> {
        let item = self.item(id, asks, millis(ttl), lease, wall);
        let reply: Vec<i64> = self.reserve.call(item).await?;
        match reply.as_slice() {
            [2] => Ok(Reply::Cancelled),
            [1, figures @ ..] if figures.len() == 3 * asks.len() => Ok(Reply::Admitted(
                figures
                    .chunks_exact(3)
                    .map(|f| RateFigures {
                        limit: u64::try_from(f[0]).unwrap_or(0),
                        remaining: u64::try_from(f[1]).unwrap_or(0),
                        reset_after: Duration::from_micros(u64::try_from(f[2]).unwrap_or(0)),
                    })
                    .collect(),
            )),
            [0, index, wait_kind, wait_us, limit, remaining, reset_us] => {
                Ok(Reply::Refused(Refused {
                    index: usize::try_from(*index - 1).unwrap_or(0),
                    wait_kind: *wait_kind,
                    wait_us: *wait_us,
                    limit: *limit,
                    remaining: *remaining,
                    reset_us: *reset_us,
                }))
            }
            other => Err(StoreError::Reply(format!("reserve answered {other:?}"))),
        }
    }

    /// Runs the settlement script; `Ok(false)` when the record had already expired (or the
    /// reservation never landed). A non-zero `tombstone` also marks the id cancelled for that
    /// long, so a reservation script for it that Redis runs later debits nothing.
    pub(crate) async fn settle(
        &self,
        id: &str,
        asks: &[Ask<'_>],
        tombstone: Duration,
        wall: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let tomb = if tombstone.is_zero() {
            0
        } else {
            millis(tombstone)
        };
        let item = self.item(id, asks, tomb, Duration::ZERO, wall);
        let reply: i64 = self.settle.call(item).await?;
        Ok(reply == 1)
    }

    /// Renews the concurrency slots of live reservations, in one script: `(reservation id,
    /// concurrency bucket)` pairs, each slot to `lease` from now (never past its record's
    /// expiry). Returns how many were renewed.
    pub(crate) async fn renew(
        &self,
        slots: &[(&str, &BucketSpec)],
        lease: Duration,
    ) -> Result<i64, StoreError> {
        let mut inv = self.renew.prepare_invoke();
        inv.arg(millis(lease));
        for (id, spec) in slots {
            inv.key(self.record_key(id));
            inv.key(self.bucket_key(spec));
            inv.arg(*id);
        }
        self.run(&inv).await
    }

    /// Runs the idempotency script on key `{p}:i:<key>` with `args` (see
    /// `lua/idempotency.lua`); answers its reply as byte strings.
    pub(crate) async fn idempotency(
        &self,
        key: &str,
        args: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut inv = self.idempotency.prepare_invoke();
        inv.key(format!("{}:i:{key}", self.tag));
        for a in args {
            inv.arg(*a);
        }
        self.run(&inv).await
    }

    /// What the server persists: `(snapshots, append-only file)` from `CONFIG GET save` (a
    /// non-empty schedule) and `CONFIG GET appendonly` (`yes`).
    ///
    /// Errors: the commands failed (managed Redis services often rename or forbid `CONFIG`).
    pub(crate) async fn persistence(&self) -> Result<(bool, bool), StoreError> {
        let mut conn = self.conn.clone();
        let get = |name: &'static str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(name);
            cmd
        };
        let save = get("save");
        let aof = get("appendonly");
        let ask = async {
            let s: HashMap<String, String> = save.query_async(&mut conn).await?;
            let a: HashMap<String, String> = aof.query_async(&mut conn).await?;
            Ok::<_, redis::RedisError>((s, a))
        };
        match tokio::time::timeout(self.op_timeout.max(Duration::from_secs(1)), ask).await {
            Ok(Ok((s, a))) => Ok((
                s.get("save").is_some_and(|v| !v.trim().is_empty()),
                a.get("appendonly").is_some_and(|v| v == "yes"),
            )),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.op_timeout)),
        }
    }

    /// Figures of one bucket; with `correct = Some((remaining, reset))`, lowers it first to
    /// what the provider reported. Returns `(limit, remaining, reset_us, changed)`.
    pub(crate) async fn figures(
        &self,
        spec: &BucketSpec,
        correct: Option<(u64, Duration)>,
        wall: DateTime<Utc>,
    ) -> Result<(i64, i64, i64, bool), StoreError> {
        let mut inv = self.figures.prepare_invoke();
        inv.key(&self.state_key);
        inv.key(self.bucket_key(spec));
        let (mode, remaining, reset) = match correct {
            Some((r, d)) => (
                "H",
                r,
                Some(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            ),
            None => ("F", 0, None),
        };
        inv.arg(1).arg(mode).arg(remaining);
        let ask = Ask {
            spec,
            amount: reset,
        };
        for v in group(&ask, wall) {
            inv.arg(v);
        }
        let reply: Vec<i64> = self.run(&inv).await?;
        match reply.as_slice() {
            [limit, remaining, reset, changed] => Ok((*limit, *remaining, *reset, *changed == 1)),
            other => Err(StoreError::Reply(format!("figures answered {other:?}"))),
        }
    }

    /// Raises a shared deadline (never lowers it). Returns whether it changed.
    pub(crate) async fn publish(&self, field: &str, until_ms: i64) -> Result<bool, StoreError> {
        let mut inv = self.signal.prepare_invoke();
        inv.key(&self.signals_key)
            .arg(field)
            .arg(until_ms)
            .arg(&self.channel);
        let reply: Vec<i64> = self.run(&inv).await?;
        Ok(reply.first() == Some(&1))
    }

    /// Every shared deadline (field → ms since the Unix epoch), including past ones.
    pub(crate) async fn load_signals(&self) -> Result<HashMap<String, i64>, StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&self.signals_key);
        match tokio::time::timeout(
            self.op_timeout,
            cmd.query_async::<HashMap<String, i64>>(&mut conn),
        )
        .await
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.op_timeout)),
        }
    }

    /// One `PING` within the op timeout (the outage probe).
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let cmd = redis::cmd("PING");
        match tokio::time::timeout(self.op_timeout, cmd.query_async::<String>(&mut conn)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.op_timeout)),
        }
    }
}

/// One reservation or settlement of a batch, encoded (see [`Remote::item`]).
#[derive(Debug)]
struct Item {
    record: String,
    tomb: String,
    id: String,
    ms: u64,
    buckets: Vec<(String, [i64; GROUP])>,
}

/// An item and where its answer goes.
#[derive(Debug)]
struct Job {
    item: Item,
    reply: oneshot::Sender<Result<Value, StoreError>>,
}

/// The sending side of one kind's batch task (see the module doc).
#[derive(Debug)]
struct Batcher {
    tx: mpsc::Sender<Job>,
    op_timeout: Duration,
    stats: Arc<BatchStats>,
}

/// Script calls sent by one batch task and the items they carried.
#[derive(Debug, Default)]
pub(crate) struct BatchStats {
    pub(crate) calls: AtomicU64,
    pub(crate) items: AtomicU64,
    /// Items dropped unsent because their caller had stopped waiting ([`Abandoned::Skip`]).
    pub(crate) skipped: AtomicU64,
}

/// What a batch task does with a queued item whose caller no longer waits for its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Abandoned {
    /// Drop it unsent. For reservations: the caller's guard cancels the id (with a tombstone),
    /// so sending it would debit only to credit back; after a Redis stall this saves a backlog
    /// of dead reservations.
    Skip,
    /// Send it anyway (settlements must reach Redis even if nobody waits).
    Send,
}

impl Batcher {
    /// Starts the batch task on the current Tokio runtime; it ends when the batcher is dropped
    /// and its last call has answered.
    fn spawn(
        conn: ConnectionManager,
        script: Script,
        state_key: String,
        op_timeout: Duration,
        abandoned: Abandoned,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let stats = Arc::new(BatchStats::default());
        tokio::spawn(run_batches(
            conn,
            script,
            state_key,
            rx,
            op_timeout,
            abandoned,
            Arc::clone(&stats),
        ));
        Batcher {
            tx,
            op_timeout,
            stats,
        }
    }

    /// Queues `item` and waits for its own answer, all within the op timeout.
    ///
    /// Errors: [`StoreError::Timeout`] when no answer came in time (the script may still
    /// run), the call's Redis error, or [`StoreError::Reply`] for an answer of the wrong shape
    /// or a stopped task.
    async fn call<T: redis::FromRedisValue>(&self, item: Item) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Reply("the batch task has stopped".to_owned());
        let exchange = async {
            self.tx
                .send(Job { item, reply })
                .await
                .map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        };
        let value = match tokio::time::timeout(self.op_timeout, exchange).await {
            Ok(v) => v?,
            Err(_) => return Err(StoreError::Timeout(self.op_timeout)),
        };
        redis::from_redis_value(value).map_err(|e| StoreError::Reply(e.to_string()))
    }
}

/// The batch task: takes what is queued (at most [`MAX_BATCH`] items) as soon as fewer than
/// [`MAX_IN_FLIGHT`] calls are out, and answers each item from its call's reply.
async fn run_batches(
    conn: ConnectionManager,
    script: Script,
    state_key: String,
    mut rx: mpsc::Receiver<Job>,
    op_timeout: Duration,
    abandoned: Abandoned,
    stats: Arc<BatchStats>,
) {
    let mut out = FuturesUnordered::new();
    let mut open = true;
    let wanted = |job: &Job| {
        let keep = abandoned == Abandoned::Send || !job.reply.is_closed();
        if !keep {
            stats.skipped.fetch_add(1, Ordering::Relaxed);
        }
        keep
    };
    while open || !out.is_empty() {
        tokio::select! {
            job = rx.recv(), if open && out.len() < MAX_IN_FLIGHT => {
                let Some(first) = job else {
                    open = false;
                    continue;
                };
                let mut batch = Vec::with_capacity(8);
                if wanted(&first) {
                    batch.push(first);
                }
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(job) if wanted(&job) => batch.push(job),
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                if batch.is_empty() {
                    continue;
                }
                stats.calls.fetch_add(1, Ordering::Relaxed);
                stats.items.fetch_add(batch.len() as u64, Ordering::Relaxed);
                out.push(send_batch(conn.clone(), &script, &state_key, batch, op_timeout));
            }
            Some(()) = out.next(), if !out.is_empty() => {}
        }
    }
}

/// One batched script call; every item gets its own part of the reply, or the call's error.
async fn send_batch(
    mut conn: ConnectionManager,
    script: &Script,
    state_key: &str,
    batch: Vec<Job>,
    op_timeout: Duration,
) {
    // Each distinct bucket is sent once (its first item's group); items refer to it by
    // index (1-based) with their own amount.
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut distinct: Vec<(&str, &[i64; GROUP])> = Vec::new();
    let refs: Vec<Vec<(usize, i64)>> = batch
        .iter()
        .map(|job| {
            job.item
                .buckets
                .iter()
                .map(|(name, g)| {
                    let i = *index.entry(name.as_str()).or_insert_with(|| {
                        distinct.push((name, g));
                        distinct.len()
                    });
                    (i, g[1])
                })
                .collect()
        })
        .collect();
    let mut inv = script.prepare_invoke();
    inv.key(state_key);
    for (name, _) in &distinct {
        inv.key(*name);
    }
    for job in &batch {
        inv.key(&job.item.record).key(&job.item.tomb);
    }
    inv.arg(batch.len()).arg(distinct.len());
    for (_, g) in &distinct {
        for v in *g {
            inv.arg(*v);
        }
    }
    for (job, refs) in batch.iter().zip(&refs) {
        inv.arg(refs.len()).arg(&job.item.id).arg(job.item.ms);
        for (i, amount) in refs {
            inv.arg(*i).arg(*amount);
        }
    }
    let answer =
        match tokio::time::timeout(op_timeout, inv.invoke_async::<Vec<Value>>(&mut conn)).await {
            Ok(Ok(values)) if values.len() == batch.len() => Ok(values),
            Ok(Ok(values)) => Err(StoreError::Reply(format!(
                "a batch of {} answered {} items",
                batch.len(),
                values.len()
            ))),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(op_timeout)),
        };
    match answer {
        Ok(values) => {
            for (job, value) in batch.into_iter().zip(values) {
                // A caller that gave up has dropped its receiver: nothing to tell.
                let _ = job.reply.send(Ok(value));
            }
        }
        Err(e) => {
            for job in batch {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

/// The script arguments of one bucket (see the layout in `lua/buckets.lua`).
fn group(ask: &Ask<'_>, wall: DateTime<Utc>) -> [i64; GROUP] {
    let amount = ask.amount.map_or(-1, clamp_i64);
    match &ask.spec.rule {
        Rule::TokenBucket { capacity, period } => {
            let (per, tick) = token_ticks(*capacity, *period);
            [
                kind(b'T'),
                amount,
                clamp_i64(*capacity),
                clamp_i64(per),
                clamp_i64(tick),
                0,
                0,
                0,
            ]
        }
        Rule::FixedWindow {
            capacity, period, ..
        } => {
            let (e0, end0, e1, end1) = match ask.spec.rule.window_at(wall) {
                Some((e0, _, end0)) => match ask.spec.rule.window_at(end0) {
                    Some((e1, _, end1)) => (e0, end0, e1, end1),
                    None => (e0, end0, e0, end0),
                },
                None => (0, wall, 0, wall),
            };
            [
                kind(b'W'),
                amount,
                clamp_i64(*capacity),
                e0,
                end0.timestamp_micros(),
                e1,
                end1.timestamp_micros(),
                i64::try_from(period.as_micros()).unwrap_or(i64::MAX),
            ]
        }
        Rule::Concurrency { limit } => [kind(b'C'), amount, clamp_i64(*limit), 0, 0, 0, 0, 0],
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Kinds travel as the characters `T`, `W`, `C`; redis-rs sends an i64 as its decimal string,
/// so the kind goes as a number that the scripts compare against the character code.
const fn kind(c: u8) -> i64 {
    c as i64
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Period in ticks and tick length in µs for a token bucket, so that `capacity × period_ticks`
/// stays below 2^53 and Lua's doubles hold every level exactly. The tick is the smallest power
/// of ten (1 µs … 1 s … the whole period) dividing the period that keeps the product in range;
/// refill then happens in whole ticks. Typical limits get 1 µs (e.g. 150,000,000 units per
/// minute or 104,000 per day), larger ones a coarser refill.
pub(crate) fn token_ticks(capacity: u64, period: Duration) -> (u64, u64) {
    let p_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX).max(1);
    let mut tick = 1u64;
    while tick <= p_us {
        if p_us % tick == 0 && u128::from(capacity) * u128::from(p_us / tick) < TWO_POW_53 {
            return (p_us / tick, tick);
        }
        match tick.checked_mul(10) {
            Some(t) => tick = t,
            None => break,
        }
    }
    (1, p_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use switchyard_core::quota::{Dimension, Scope};

    /// A cancel that reaches Redis before its reservation wins: the reservation script finds
    /// the tombstone and debits nothing (the order a reconnect or a second connection allows).
    #[tokio::test]
    async fn cancel_overtaking_its_reservation_wins() {
        let server = switchyard_testkit::RedisServer::start().unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_connection_manager().await.unwrap();
        let remote = Remote::new(conn, "tomb", Duration::from_secs(2));
        let slots = Arc::new(BucketSpec {
            key: "t/conc".into(),
            scope: Scope::Tenant("t".into()),
            dimension: Dimension::Concurrency,
            rule: Rule::Concurrency { limit: 1 },
            count_cached_input: false,
        });
        let wall = Utc::now();
        let id = remote.next_id();
        let cancel = [Ask {
            spec: &slots,
            amount: Some(0),
        }];
        let settled = remote
            .settle(&id, &cancel, Duration::from_secs(30), wall)
            .await
            .unwrap();
        assert!(!settled, "nothing to settle yet");
        let ask = [Ask {
            spec: &slots,
            amount: Some(1),
        }];
        let lease = Duration::from_secs(4);
        let ttl = Duration::from_secs(30);
        let late = remote.reserve(&id, &ask, ttl, lease, wall).await.unwrap();
        assert!(matches!(late, Reply::Cancelled), "{late:?}");
        let (limit, remaining, _, _) = remote.figures(&slots, None, wall).await.unwrap();
        assert_eq!((limit, remaining), (1, 1), "the slot was never taken");
        // Another id is admitted as usual, and its slot is leased.
        let other = remote.next_id();
        let admitted = remote
            .reserve(&other, &ask, ttl, lease, wall)
            .await
            .unwrap();
        assert!(matches!(admitted, Reply::Admitted(_)), "{admitted:?}");
        assert_eq!(
            remote
                .renew(&[(other.as_str(), &slots)], lease)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            remote.renew(&[(id.as_str(), &slots)], lease).await.unwrap(),
            0
        );
    }

    /// Fifty reservations sent at once travel in a few batched calls, share one token bucket
    /// in item order (exactly its 30 units are admitted, each item keeps its own answer), and
    /// their batched settlements credit every unit back.
    #[tokio::test]
    async fn a_batch_shares_its_buckets_in_item_order() {
        let server = switchyard_testkit::RedisServer::start().unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let conn = client.get_connection_manager().await.unwrap();
        let remote = Remote::new(conn, "batch", Duration::from_secs(2));
        let tokens = Arc::new(BucketSpec {
            key: "t/tokens".into(),
            scope: Scope::Tenant("t".into()),
            dimension: Dimension::InputTokens,
            rule: Rule::TokenBucket {
                capacity: 30,
                period: Duration::from_secs(3600),
            },
            count_cached_input: false,
        });
        let slots = Arc::new(BucketSpec {
            key: "t/conc".into(),
            scope: Scope::Tenant("t".into()),
            dimension: Dimension::Concurrency,
            rule: Rule::Concurrency { limit: 1000 },
            count_cached_input: false,
        });
        let wall = Utc::now();
        let ttl = Duration::from_secs(30);
        let ids: Vec<String> = (0..50).map(|_| remote.next_id()).collect();
        let replies = futures::future::join_all(ids.iter().map(|id| {
            let asks = [
                Ask {
                    spec: &tokens,
                    amount: Some(1),
                },
                Ask {
                    spec: &slots,
                    amount: Some(1),
                },
            ];
            let remote = &remote;
            async move { remote.reserve(id, &asks, ttl, Duration::ZERO, wall).await }
        }))
        .await;
        let mut admitted = Vec::new();
        for (id, reply) in ids.iter().zip(replies) {
            match reply.unwrap() {
                Reply::Admitted(figures) => {
                    assert_eq!(figures.len(), 2);
                    admitted.push((id, figures[0].remaining));
                }
                Reply::Refused(r) => assert_eq!(r.index, 0, "the token bucket binds"),
                Reply::Cancelled => panic!("nothing was cancelled"),
            }
        }
        assert_eq!(admitted.len(), 30, "exactly the bucket's capacity");
        // In item order, each admitted item saw the bucket after its own debit.
        let mut left: Vec<u64> = admitted.iter().map(|(_, r)| *r).collect();
        left.sort_unstable();
        assert_eq!(left, (0..30).collect::<Vec<u64>>());
        let [(calls, items), _] = remote.batch_stats();
        assert_eq!(items, 50);
        assert!(
            calls < items,
            "{calls} calls for {items} items: nothing was batched"
        );
        let (_, remaining, _, _) = remote.figures(&tokens, None, wall).await.unwrap();
        assert_eq!(remaining, 0);

        let settled = futures::future::join_all(admitted.iter().map(|(id, _)| {
            let asks = [
                Ask {
                    spec: &tokens,
                    amount: Some(0),
                },
                Ask {
                    spec: &slots,
                    amount: Some(1),
                },
            ];
            let remote = &remote;
            async move { remote.settle(id, &asks, Duration::ZERO, wall).await }
        }))
        .await;
        assert!(settled.into_iter().all(|s| s.unwrap()));
        let (_, remaining, _, _) = remote.figures(&tokens, None, wall).await.unwrap();
        assert_eq!(remaining, 30, "every unit credited back");
        let (_, free, _, _) = remote.figures(&slots, None, wall).await.unwrap();
        assert_eq!(free, 1000, "every slot freed");
    }

    #[test]
    fn token_ticks_large_daily_capacity_coarsens_refill() {
        assert_eq!(
            token_ticks(10_000, Duration::from_secs(60)),
            (60_000_000, 1)
        );
        let (per, tick) = token_ticks(10_000_000_000, Duration::from_secs(86_400));
        assert_eq!(per * tick, 86_400_000_000);
        assert!(u128::from(per) * 10_000_000_000 < TWO_POW_53);
        assert_eq!(tick, 100_000, "0.1 s: 10^10 × 864,000 < 2^53");
    }
}
