//! The in-process backend: a core [`Ledger`] behind a mutex, keyed by [`BucketSpec::key`].
//!
//! The same type serves the Redis store's fallback, with every capacity divided by the
//! replica share (`⌈C / share⌉`), so the code path during an outage is the tested in-process
//! one.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use switchyard_core::quota::{
    BucketId, BucketSpec, Demand, Ledger, RateFigures, Refusal, ReservationId, ReserveError, Rule,
    Usage,
};
use switchyard_core::time::Instant;

/// The caller's tightest bucket after a reservation: position in its bucket list, figures.
pub(crate) type Tightest = Option<(usize, RateFigures)>;

/// How a reservation is settled (the three exits of core's ledger).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Settle {
    /// Reported usage: credit back or charge the overrun.
    Actual(Usage),
    /// Nothing reported: keep the estimate.
    KeepEstimate,
    /// Never sent: credit everything.
    Nothing,
}

/// Wall-clock time at the process edge (window boundaries, header figures).
#[allow(clippy::disallowed_methods)] // the store's one wall-clock read; tests pass their own ledger times through core
pub(crate) fn wall_now() -> DateTime<Utc> {
    Utc::now()
}

/// Hashes a pointer address with one multiplication (Fibonacci hashing): the fast path for
/// specs the caller passes again as the same `Arc`, which is the normal case for a router
/// reading one config snapshot. SipHash over the key string costs ~25 ns a bucket.
#[derive(Debug, Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Entries beyond this many times the number of buckets mean old config snapshots: the
/// address cache is cleared (its `Arc`s keep old specs alive until then).
const ADDR_CACHE_SLACK: usize = 4;

#[derive(Debug)]
struct Known {
    spec: Arc<BucketSpec>,
    id: BucketId,
}

/// A ledger, the specs registered in it, and the monotonic origin its instants count from.
#[derive(Debug)]
pub(crate) struct LocalBook {
    ledger: Ledger,
    known: HashMap<String, Known>,
    /// Spec address → id, for `Arc`s already seen (holds the `Arc` so the address stays valid).
    by_addr: HashMap<usize, Known, BuildHasherDefault<AddrHasher>>,
    origin: tokio::time::Instant,
    /// 1 in process; the replica share in fallback.
    share: u64,
    /// Scratch list of ids for one reservation (kept to avoid an allocation per call).
    ids: Vec<BucketId>,
}

impl LocalBook {
    pub(crate) fn new(share: u64) -> Self {
        LocalBook {
            ledger: Ledger::new(),
            known: HashMap::new(),
            by_addr: HashMap::default(),
            origin: tokio::time::Instant::now(),
            share: share.max(1),
            ids: Vec::new(),
        }
    }

    fn now(&self) -> Instant {
        Instant::from_origin(tokio::time::Instant::now().saturating_duration_since(self.origin))
    }

    /// The ledger id of `spec`, registering it when new or changed. An invalid spec is
    /// reported and left out (`None`): config is validated where it is loaded, and one bad
    /// bucket must not stop all traffic.
    fn id_of(
        &mut self,
        spec: &Arc<BucketSpec>,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Option<BucketId> {
        let addr = Arc::as_ptr(spec) as usize;
        if let Some(k) = self.by_addr.get(&addr) {
            return Some(k.id);
        }
        let id = match self.known.get(&spec.key) {
            Some(k) if Arc::ptr_eq(&k.spec, spec) || *k.spec == **spec => k.id,
            _ => self.register(spec, now, wall)?,
        };
        if self.by_addr.len() >= ADDR_CACHE_SLACK * self.known.len() + 64 {
            self.by_addr.clear();
        }
        self.by_addr.insert(
            addr,
            Known {
                spec: Arc::clone(spec),
                id,
            },
        );
        Some(id)
    }

    fn register(
        &mut self,
        spec: &Arc<BucketSpec>,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Option<BucketId> {
        let scaled = scale(spec, self.share);
        match self.ledger.register(scaled, now, wall) {
            Ok(id) => {
                self.known.insert(
                    spec.key.clone(),
                    Known {
                        spec: Arc::clone(spec),
                        id,
                    },
                );
                // A changed spec under the same key: addresses cached for the old one must
                // not keep reaching it, so every cached address is forgotten.
                self.by_addr.clear();
                Some(id)
            }
            Err(e) => {
                tracing::error!(bucket = %spec.key, error = %e, "invalid quota bucket left out of reservations");
                None
            }
        }
    }

    /// Reserves on `specs` (a key listed twice is charged once); refusals name the binding
    /// bucket by its first position in `specs`.
    pub(crate) fn reserve(
        &mut self,
        specs: &[Arc<BucketSpec>],
        demand: Demand,
        ttl: Duration,
    ) -> Result<(ReservationId, Tightest), Box<Refusal>> {
        let now = self.now();
        let wall = wall_now();
        // Abandoned reservations free their slots here: O(1) unless one is due.
        self.ledger.expire(now);
        let mut ids = std::mem::take(&mut self.ids);
        ids.clear();
        for spec in specs {
            if let Some(id) = self.id_of(spec, now, wall) {
                ids.push(id);
            }
        }
        let out = self.ledger.reserve(&ids, demand, now, wall, now + ttl);
        let out = out.map(|id| {
            let tightest = self.ledger.tightest(&ids, now, wall).and_then(|(b, f)| {
                let key = &self.ledger.spec(b)?.key;
                Some((specs.iter().position(|s| s.key == *key)?, f))
            });
            (id, tightest)
        });
        self.ids = ids;
        match out {
            Ok(x) => Ok(x),
            Err(ReserveError::Refused(mut r)) => {
                let pos = specs.iter().position(|s| s.key == r.key).unwrap_or(0);
                r.bucket = BucketId::from_index(u32::try_from(pos).unwrap_or(u32::MAX));
                Err(r)
            }
            // Ids come from this ledger; nothing to refuse on.
            Err(ReserveError::UnknownBucket(_)) => Err(Box::new(unknown_refusal())),
        }
    }

    /// Settles a reservation; `false` when it was no longer live (expired or settled).
    pub(crate) fn settle(&mut self, id: ReservationId, how: Settle) -> bool {
        let now = self.now();
        let wall = wall_now();
        let out = match how {
            Settle::Actual(u) => self.ledger.reconcile(id, u, now, wall),
            Settle::KeepEstimate => self.ledger.release(id, None, now, wall),
            Settle::Nothing => self.ledger.cancel(id, now, wall),
        };
        out.is_ok()
    }

    /// The id of a spec passed by reference (header figures, corrections): found by key and
    /// equality, registered when new or changed, never added to the address cache (callers
    /// build these specs afresh, and caching them would evict the reservation fast path).
    fn id_by_value(
        &mut self,
        spec: &BucketSpec,
        now: Instant,
        wall: DateTime<Utc>,
    ) -> Option<BucketId> {
        match self.known.get(&spec.key) {
            Some(k) if *k.spec == *spec => Some(k.id),
            _ => self.register(&Arc::new(spec.clone()), now, wall),
        }
    }

    pub(crate) fn figures(&mut self, spec: &BucketSpec) -> Option<RateFigures> {
        let now = self.now();
        let wall = wall_now();
        let id = self.id_by_value(spec, now, wall)?;
        self.ledger.remaining(id, now, wall)
    }

    pub(crate) fn correct(&mut self, spec: &BucketSpec, remaining: u64, reset: Duration) -> bool {
        let now = self.now();
        let wall = wall_now();
        let Some(id) = self.id_by_value(spec, now, wall) else {
            return false;
        };
        // The provider reports its whole remaining; this replica may use its share of it.
        let remaining = remaining.div_ceil(self.share);
        self.ledger
            .correct_from_headers(id, remaining, Some(reset), now, wall)
            .unwrap_or(false)
    }

    /// Live reservations in the ledger (after expiring the due ones).
    pub(crate) fn live(&mut self) -> usize {
        let now = self.now();
        self.ledger.expire(now);
        self.ledger.in_flight()
    }
}

/// `spec` with its capacity divided by `share`, rounded up (`⌈C / share⌉`; 0 stays 0).
pub(crate) fn scale(spec: &BucketSpec, share: u64) -> BucketSpec {
    let mut out = spec.clone();
    if share <= 1 {
        return out;
    }
    match &mut out.rule {
        Rule::TokenBucket { capacity, .. } | Rule::FixedWindow { capacity, .. } => {
            *capacity = capacity.div_ceil(share);
        }
        Rule::Concurrency { limit } => *limit = limit.div_ceil(share),
    }
    out
}

/// A refusal for the impossible case of a ledger rejecting its own ids.
fn unknown_refusal() -> Refusal {
    Refusal {
        bucket: BucketId::from_index(0),
        key: String::new(),
        scope: switchyard_core::quota::Scope::Tenant(String::new()),
        dimension: switchyard_core::quota::Dimension::Requests,
        reason: "quota_store_error".into(),
        wait: switchyard_core::quota::Wait::OnRelease,
        demanded: 0,
        figures: RateFigures {
            limit: 0,
            remaining: 0,
            reset_after: Duration::ZERO,
        },
    }
}
