//! The Redis backend: one Lua script per reservation and one per settlement (EVALSHA through
//! [`redis::Script`], which loads the script on `NOSCRIPT`), all keys under one hash tag.
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use redis::{Script, ScriptInvocation};
use switchyard_core::quota::{BucketSpec, RateFigures, Rule};

use crate::StoreError;

const PRELUDE: &str = include_str!("lua/buckets.lua");
const TWO_POW_53: u128 = 1 << 53;

/// Arguments per bucket in the scripts (`GROUP` in `lua/buckets.lua`).
const GROUP: usize = 8;

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
    reserve: Script,
    settle: Script,
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
            conn,
            tag: format!("{{{prefix}}}"),
            state_key: format!("{{{prefix}}}:buckets"),
            channel: format!("{{{prefix}}}:signals"),
            signals_key: format!("{{{prefix}}}:signals"),
            reserve: script(include_str!("lua/reserve.lua")),
            settle: script(include_str!("lua/settle.lua")),
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

    fn push_buckets(
        &self,
        inv: &mut ScriptInvocation<'_>,
        id: &str,
        asks: &[Ask<'_>],
        head: &[String],
        lease: Duration,
        wall: DateTime<Utc>,
    ) {
        inv.key(self.record_key(id));
        inv.key(&self.state_key);
        for a in asks {
            inv.key(self.bucket_key(a.spec));
        }
        inv.key(self.tomb_key(id));
        for h in head {
            inv.arg(h);
        }
        for a in asks {
            let mut g = group(a, wall);
            if !lease.is_zero() && matches!(a.spec.rule, Rule::Concurrency { .. }) {
                // The slot lease travels in the concurrency group's first free slot (b+3).
                g[3] = clamp_i64(millis(lease));
            }
            for v in g {
                inv.arg(v);
            }
        }
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
        let ttl_ms = millis(ttl);
        let mut inv = self.reserve.prepare_invoke();
        let head = [asks.len().to_string(), id.to_owned(), ttl_ms.to_string()];
        self.push_buckets(&mut inv, id, asks, &head, lease, wall);
        let reply: Vec<i64> = self.run(&inv).await?;
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
        let mut inv = self.settle.prepare_invoke();
        let tomb = if tombstone.is_zero() {
            0
        } else {
            millis(tombstone)
        };
        let head = [asks.len().to_string(), id.to_owned(), tomb.to_string()];
        self.push_buckets(&mut inv, id, asks, &head, Duration::ZERO, wall);
        let reply: i64 = self.run(&inv).await?;
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
