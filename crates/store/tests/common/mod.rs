//! Bucket builders and helpers shared by the store tests.
#![allow(dead_code)] // each test file uses a subset
#![allow(clippy::unwrap_used)] // setup helpers: a failed setup must fail the test loudly

use std::sync::Arc;
use std::time::Duration;

use chrono::{Timelike, Utc};
use chrono_tz::Tz;
use switchyard_core::quota::{BucketSpec, Demand, Dimension, Rule, Scope, Usage};
use switchyard_store::{QuotaStore, RedisOptions};
use switchyard_testkit::RedisServer;

pub(crate) const TTL: Duration = Duration::from_secs(30);

/// A daily fixed window whose reset is 12 hours away from now, so no test straddles it.
pub(crate) fn daily(capacity: u64) -> Rule {
    #[allow(clippy::disallowed_methods)] // test setup: pick a reset time far from now
    let hour = (Utc::now().hour() + 12) % 24;
    Rule::FixedWindow {
        capacity,
        period: Duration::from_secs(86_400),
        reset_at: Some((u8::try_from(hour).unwrap(), 0)),
        tz: Tz::UTC,
    }
}

pub(crate) fn per_minute_tokens(capacity: u64) -> Rule {
    Rule::TokenBucket {
        capacity,
        period: Duration::from_secs(60),
    }
}

pub(crate) fn spec(key: &str, scope: Scope, dimension: Dimension, rule: Rule) -> Arc<BucketSpec> {
    Arc::new(BucketSpec {
        key: key.into(),
        scope,
        dimension,
        rule,
        count_cached_input: false,
    })
}

pub(crate) fn tenant(name: &str) -> Scope {
    Scope::Tenant(name.into())
}

pub(crate) fn conc(key: &str, limit: u64) -> Arc<BucketSpec> {
    spec(
        key,
        tenant("t1"),
        Dimension::Concurrency,
        Rule::Concurrency { limit },
    )
}

pub(crate) fn one_request() -> Demand {
    Demand {
        requests: 1,
        ..Demand::default()
    }
}

pub(crate) fn input(tokens: u64) -> Demand {
    Demand {
        requests: 1,
        input_tokens: tokens,
        ..Demand::default()
    }
}

pub(crate) fn used_input(tokens: u64) -> Usage {
    Usage {
        input_uncached: tokens,
        ..Usage::default()
    }
}

/// A unique key prefix per store group, so tests sharing a server never collide.
pub(crate) fn prefix(name: &str) -> String {
    format!("test-{name}-{:x}", rand_suffix())
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed) ^ u64::from(std::process::id()) << 20
}

pub(crate) fn opts(server: &RedisServer, prefix: &str) -> RedisOptions {
    let mut o = RedisOptions::new(server.url());
    o.key_prefix = prefix.into();
    // Generous on a shared 2-core build machine: a timeout here would be a fallback, not a
    // failure, and would change what the tests measure.
    o.op_timeout = Duration::from_secs(2);
    o.probe_interval = Duration::from_millis(100);
    o
}

pub(crate) async fn redis_store(server: &RedisServer, prefix: &str) -> QuotaStore {
    QuotaStore::redis(opts(server, prefix)).await.unwrap()
}

/// Waits (up to 5 s) until the store has no reservation in flight.
pub(crate) async fn settle_down(store: &QuotaStore) {
    for _ in 0..500 {
        if store.in_flight() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.in_flight(),
        0,
        "reservations still in flight after 5 s"
    );
}

pub(crate) async fn remaining(store: &QuotaStore, b: &BucketSpec) -> u64 {
    store.figures(b).await.unwrap().remaining
}
