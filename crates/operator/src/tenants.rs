//! TenantQuota status in a cluster (issue 17 item 5): what the leader writes from the router
//! replicas' `GET /outcomes` reports.
//!
//! **Counts.** Each replica reports cumulative `throttled` / `rejected` per tenant since it
//! started. The status holds fleet totals plus, in `status.counted`, how far each live replica
//! has been counted (its name, start time and the counters at that point). Each interval the
//! leader adds, per reachable replica, its counters minus the checkpoint of the same process
//! (all of them for a process it has not counted yet), and writes totals and checkpoints in one
//! status patch. A missed interval, a status write that failed, or a new leader reading the
//! stored status therefore counts every request exactly once; a replica that restarted under
//! the same name starts a new checkpoint. Checkpoints of replicas that no longer report are
//! dropped only after a complete round (every discovered replica answered), so a replica that
//! was briefly unreachable is not counted twice. The same scheme as the providers'
//! `status.counted` (`crate::outcomes`).
//!
//! **Usage.** With the quota store on Redis every replica reads the same buckets, so the
//! figures of one replica are the fleet's: per limit, the reading with the most used units
//! (the freshest, as scrapes are not simultaneous) is kept. With in-process stores (or while
//! Redis is down, `local_fallback`) each replica enforces its own buckets, and the status shows
//! their sum: used, amount and remaining added up, the longest reset.

use std::collections::BTreeMap;

use switchyard_api::outcomes::OutcomeReport;
use switchyard_api::tenant::{LimitUsage, TenantCounted, TenantQuotaStatus};

/// Checkpoints kept per tenant at most (the CRD's bound on `status.counted`).
pub const MAX_COUNTED: usize = 256;

/// The counting part of a tenant's status: totals and checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Book {
    /// Fleet total of throttled requests.
    pub throttled: u64,
    /// Fleet total of rejected requests.
    pub rejected: u64,
    /// Per replica process, what of its counters the totals include.
    pub counted: Vec<TenantCounted>,
}

impl Book {
    /// The book held in a stored status.
    pub fn from_status(status: Option<&TenantQuotaStatus>) -> Book {
        status.map_or_else(Book::default, |s| Book {
            throttled: s.throttled,
            rejected: s.rejected,
            counted: s.counted.clone(),
        })
    }

    /// Takes one round of `reports` into the book for tenant `key`. `complete`: every
    /// discovered replica answered this round (then checkpoints of replicas that did not
    /// report are dropped).
    pub fn absorb(&self, key: &str, reports: &[&OutcomeReport], complete: bool) -> Book {
        let mut next = Book {
            throttled: self.throttled,
            rejected: self.rejected,
            counted: Vec::new(),
        };
        for report in reports {
            let started_at = report
                .started_at
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
            let cur = report.tenants.get(key).cloned().unwrap_or_default();
            if next
                .counted
                .iter()
                .any(|c| c.replica == report.replica && c.started_at == started_at)
            {
                // Two addresses answering for one process: counted once.
                continue;
            }
            let prev = self
                .counted
                .iter()
                .find(|c| c.replica == report.replica && c.started_at == started_at);
            let (t0, r0) = prev.map_or((0, 0), |c| (c.throttled, c.rejected));
            // A counter below its checkpoint cannot come from the same process; count it anew.
            let (t0, r0) = if cur.throttled < t0 || cur.rejected < r0 {
                (0, 0)
            } else {
                (t0, r0)
            };
            next.throttled = next.throttled.saturating_add(cur.throttled - t0);
            next.rejected = next.rejected.saturating_add(cur.rejected - r0);
            next.counted.push(TenantCounted {
                replica: report.replica.clone(),
                started_at,
                throttled: cur.throttled,
                rejected: cur.rejected,
            });
        }
        if !complete {
            // Keep what is not known to be gone: a replica that did not answer keeps its
            // checkpoint (unless it answered under a newer start, i.e. restarted).
            for c in &self.counted {
                let superseded = next.counted.iter().any(|n| n.replica == c.replica);
                if !superseded {
                    next.counted.push(c.clone());
                }
            }
        }
        if next.counted.len() > MAX_COUNTED {
            // Oldest processes first out: they are the likeliest to be gone.
            next.counted.sort_by(|a, b| b.started_at.cmp(&a.started_at));
            next.counted.truncate(MAX_COUNTED);
        }
        next.counted
            .sort_by(|a, b| (&a.replica, &a.started_at).cmp(&(&b.replica, &b.started_at)));
        next
    }
}

/// The fleet's usage of tenant `key`'s own limits from this round's `reports` (see the module
/// docs); empty when no replica reported any.
pub fn fleet_usage(key: &str, reports: &[&OutcomeReport]) -> Vec<LimitUsage> {
    let usage_of = |r: &&OutcomeReport| -> Vec<LimitUsage> {
        r.tenants
            .get(key)
            .map(|t| t.usage.clone())
            .unwrap_or_default()
    };
    let shared = reports.iter().any(|r| r.quota_store == "redis");
    let mut by_limit: BTreeMap<String, LimitUsage> = BTreeMap::new();
    let readings = reports
        .iter()
        .filter(|r| !shared || r.quota_store == "redis")
        .flat_map(usage_of);
    for u in readings {
        match by_limit.get_mut(&u.limit) {
            None => {
                by_limit.insert(u.limit.clone(), u);
            }
            // One store read by every replica: keep the freshest reading.
            Some(have) if shared => {
                if u.used > have.used {
                    *have = u;
                }
            }
            // Each replica's own buckets: the fleet's figures are their sum.
            Some(sum) => {
                sum.used = sum.used.saturating_add(u.used);
                sum.amount = sum.amount.saturating_add(u.amount);
                sum.remaining = sum.remaining.saturating_add(u.remaining);
                sum.reset_after_seconds = sum.reset_after_seconds.max(u.reset_after_seconds);
            }
        }
    }
    by_limit.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_api::outcomes::TenantOutcomes;

    fn report(replica: &str, started: &str, throttled: u64, rejected: u64) -> OutcomeReport {
        let mut tenants = BTreeMap::new();
        tenants.insert(
            "ns/t".to_owned(),
            TenantOutcomes {
                throttled,
                rejected,
                usage: Vec::new(),
            },
        );
        OutcomeReport {
            replica: replica.to_owned(),
            started_at: started.parse().unwrap(),
            providers: BTreeMap::new(),
            tenants,
            quota_store: "in_process".to_owned(),
        }
    }

    const T0: &str = "2026-12-04T10:00:00Z";
    const T1: &str = "2026-12-04T11:00:00Z";

    #[test]
    fn every_request_is_counted_once_across_rounds_restarts_and_missed_scrapes() {
        let book = Book::default();
        let a = report("a", T0, 2, 5);
        let b = report("b", T0, 1, 0);
        let book = book.absorb("ns/t", &[&a, &b], true);
        assert_eq!((book.throttled, book.rejected), (3, 5));
        // Same counters again (a failed write re-read, or nothing happened): no change.
        let again = book.absorb("ns/t", &[&a, &b], true);
        assert_eq!(again, book);
        // b unreachable for a round: its checkpoint stays, a's delta counts.
        let a2 = report("a", T0, 4, 6);
        let book = book.absorb("ns/t", &[&a2], false);
        assert_eq!((book.throttled, book.rejected), (5, 6));
        assert_eq!(book.counted.len(), 2);
        // b back with more: only the rest is counted.
        let b2 = report("b", T0, 3, 1);
        let book = book.absorb("ns/t", &[&a2, &b2], true);
        assert_eq!((book.throttled, book.rejected), (7, 7));
        // a restarted under its name: its new counters are all new; its old checkpoint goes.
        let a3 = report("a", T1, 1, 0);
        let book = book.absorb("ns/t", &[&a3, &b2], true);
        assert_eq!((book.throttled, book.rejected), (8, 7));
        assert_eq!(
            book.counted
                .iter()
                .map(|c| (c.replica.as_str(), c.started_at.as_str()))
                .collect::<Vec<_>>(),
            [("a", T1), ("b", T0)]
        );
        // A complete round without b: b is gone, its checkpoint dropped, totals kept.
        let book = book.absorb("ns/t", &[&a3], true);
        assert_eq!((book.throttled, book.rejected), (8, 7));
        assert_eq!(book.counted.len(), 1);
        // The same process behind two addresses is counted once.
        let a4 = report("a", T1, 2, 0);
        let book = book.absorb("ns/t", &[&a4, &a4], true);
        assert_eq!((book.throttled, book.rejected), (9, 7));
    }

    #[test]
    fn checkpoints_stay_bounded() {
        let mut book = Book::default();
        for i in 0..(MAX_COUNTED + 50) {
            let started = format!("2026-12-04T10:{:02}:{:02}Z", i / 60, i % 60);
            let r = report(&format!("r{i}"), &started, 1, 0);
            book = book.absorb("ns/t", &[&r], false);
        }
        assert_eq!(book.counted.len(), MAX_COUNTED);
        assert_eq!(book.throttled, (MAX_COUNTED + 50) as u64);
    }

    fn usage(limit: &str, used: u64, amount: u64, reset: u64) -> LimitUsage {
        LimitUsage {
            limit: limit.to_owned(),
            dimension: "requests".to_owned(),
            used,
            amount,
            remaining: amount - used,
            window: Some("60s".to_owned()),
            reset_after_seconds: reset,
        }
    }

    fn with_usage(store: &str, replica: &str, u: Vec<LimitUsage>) -> OutcomeReport {
        let mut r = report(replica, T0, 0, 0);
        r.quota_store = store.to_owned();
        r.tenants.get_mut("ns/t").unwrap().usage = u;
        r
    }

    #[test]
    fn usage_is_one_reading_of_a_shared_store_and_the_sum_of_local_ones() {
        let a = with_usage("redis", "a", vec![usage("rpm", 10, 100, 30)]);
        let b = with_usage("redis", "b", vec![usage("rpm", 12, 100, 29)]);
        let shared = fleet_usage("ns/t", &[&a, &b]);
        assert_eq!(shared, [usage("rpm", 12, 100, 29)]);
        let a = with_usage("in_process", "a", vec![usage("rpm", 10, 100, 30)]);
        let b = with_usage("in_process", "b", vec![usage("rpm", 12, 100, 40)]);
        let local = fleet_usage("ns/t", &[&a, &b]);
        assert_eq!(local.len(), 1);
        assert_eq!(
            (local[0].used, local[0].amount, local[0].remaining),
            (22, 200, 178)
        );
        assert_eq!(local[0].reset_after_seconds, 40);
        assert!(fleet_usage("ns/other", &[&a, &b]).is_empty());
    }
}
