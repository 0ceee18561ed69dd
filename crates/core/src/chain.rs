//! Sticky fallback chains by weighted rendezvous hashing (DESIGN §4.3).
//!
//! For a project key `k` and provider `i` with weight `wi > 0`:
//!
//! ```text
//! ui   = hash(k, name_i) mapped into the open interval (0,1)
//! keyi = −ln(ui) / wi
//! chain = providers sorted by ascending keyi, then the zero-weight providers in configured order
//! ```
//!
//! `−ln(u)/w` is an exponential variable with rate `w`; the smallest of independent exponentials
//! is provider `i` with probability `wi/Σw`, and the remaining order is again the same race
//! among the rest, so a chain is a weighted sample without replacement (the sampling procedure of
//! the sticky-chain article, seed 000; the key transform is the weighted rendezvous hash of
//! Schindelhauer & Schomaker, "Weighted distributed hash tables", 2005, and the exponential-race
//! view of Efraimidis & Spirakis, 2006). Because `ui` depends only on the key and the provider's
//! *name*, every router replica computes the same chain without shared state, adding or removing
//! a provider does not reorder the others, and changing one weight moves only the keys whose
//! first choice must change.
//!
//! The hash is XXH3-64 (the `xxhash-rust` crate): its output is specified and identical on every
//! platform, build and process, unlike `std`'s `DefaultHasher`, whose algorithm may change between
//! Rust releases and whose `RandomState` is seeded per process. The key is hashed once and its
//! hash seeds the hash of each provider name.
//!
//! [`ChainPins`] pins a project's chain for an affinity duration so that weight jitter between
//! controller intervals does not reshuffle it, and [`ChainPins::move_to_front`] moves the affinity
//! with the project after a failover (field case 22). Dispatch walks a chain with
//! [`first_eligible`] / [`eligible_in_order`], skipping providers that are ineligible right now
//! without re-sampling.
//!
//! **Tiers** ([`tiered_chain`], issue 18 item 4): when a route has priority tiers and static
//! weights ([`crate::weights::Tiers`]), the head of a chain is drawn by the same race over the
//! tiered cascade weights (so first attempts follow weight × availability inside a tier and
//! spill to lower tiers only for the share higher tiers leave), and the rest of the chain is in
//! tier order, each tier drawn by the same race over the static weights: a project's fallback
//! goes to its tier's other members, then to the next tier, and no part of the order depends
//! on the list order inside a tier. Weight-0 providers come after every provider of positive
//! weight (by tier, then list order), so they get no attempt while any other provider is
//! eligible.
//!
//! Alternatives rejected: a fresh weighted sample per request (no affinity, prompt caches lost);
//! consistent-hash rings (need virtual nodes to follow weights and reshuffle more keys per weight
//! change); a shared pin store as the only source of affinity (a replica without the entry would
//! pick differently; rendezvous makes the pin cache an optimisation, not a requirement).

use std::hash::{BuildHasher as _, BuildHasherDefault, RandomState};
use std::num::NonZeroUsize;
use std::time::Duration;

use lru::LruCache;
use smallvec::SmallVec;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::time::Instant;
use crate::weights::Tiers;

/// Seed for hashing project keys. Fixed forever: changing it reshuffles every project's chain.
const KEY_SEED: u64 = 0x5357_4954_4348_5944; // "SWITCHYD"
/// Seed for the provider-set fingerprint kept with each pin.
const SET_SEED: u64 = 0x5345_5453_4545_4430; // "SETSEED0"
/// Seed of the per-project return stagger ([`return_stagger`]), independent of the rendezvous.
const RETURN_SEED: u64 = 0x5245_5455_524e_5330; // "RETURNS0"

/// Chains with at most this many weighted providers are ordered without heap allocation.
const INLINE_PROVIDERS: usize = 16;

/// Hash of a project key; the seed for the per-provider hashes.
fn key_hash(key: &str) -> u64 {
    xxh3_64_with_seed(key.as_bytes(), KEY_SEED)
}

/// Maps a 64-bit hash to a uniform value strictly inside (0,1): the top 52 bits give the integer
/// `m ∈ [0, 2^52)`, and `(m + 0.5) / 2^52` is exact in an `f64` (53 significant bits), never 0
/// (so `ln u` is finite) and at most `1 − 2^−53`, never 1 (so `−ln u > 0` and a positive weight
/// always yields a positive, finite key). With 53 bits the midpoint would round up to 1.
fn unit_open(h: u64) -> f64 {
    const SCALE: f64 = 1.0 / (1u64 << 52) as f64;
    ((h >> 12) as f64 + 0.5) * SCALE
}

/// The uniform draw `ui ∈ (0,1)` for a project key and a provider name.
///
/// Exposed so tests and the simulator can check the distribution; stable across processes,
/// builds and platforms.
pub fn rendezvous_unit(key: &str, provider: &str) -> f64 {
    unit_open(xxh3_64_with_seed(provider.as_bytes(), key_hash(key)))
}

/// A usable sampling weight: finite and positive, else `None` (the provider goes to the tail).
fn usable_weight(w: f64) -> Option<f64> {
    (w.is_finite() && w > 0.0).then_some(w)
}

/// The sticky chain of project `key` over `providers` (names in configured priority order).
///
/// `weights[i]` is provider `i`'s sampling weight (any positive scale; typically the output of
/// [`crate::weights::cascade_weights`]). Weights that are 0, negative, NaN or infinite, and
/// missing weights when `weights` is shorter than `providers`, count as zero weight; extra weights
/// are ignored. Returns a permutation of `0..providers.len()`: positive-weight providers by
/// ascending `−ln(ui)/wi`, then zero-weight providers in configured order. Deterministic in
/// `(key, provider names, weights)`.
pub fn sticky_chain(key: &str, providers: &[&str], weights: &[f64]) -> Vec<usize> {
    let mut out = Vec::with_capacity(providers.len());
    sticky_chain_into(key, providers, weights, &mut out);
    out
}

/// [`sticky_chain`] writing into a caller-owned buffer (cleared first), so a hot path can reuse
/// one allocation.
pub fn sticky_chain_into(key: &str, providers: &[&str], weights: &[f64], out: &mut Vec<usize>) {
    out.clear();
    let seed = key_hash(key);
    let mut ranked: SmallVec<[(f64, usize); INLINE_PROVIDERS]> = SmallVec::new();
    for (i, name) in providers.iter().enumerate() {
        let Some(w) = weights.get(i).copied().and_then(usable_weight) else {
            continue;
        };
        let u = unit_open(xxh3_64_with_seed(name.as_bytes(), seed));
        ranked.push((-u.ln() / w, i));
    }
    // Keys are finite and positive, so `total_cmp` is the numeric order; equal keys (practically
    // impossible) fall back to configured order so the result stays deterministic.
    ranked.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    out.extend(ranked.iter().map(|&(_, i)| i));
    for i in 0..providers.len() {
        if weights.get(i).copied().and_then(usable_weight).is_none() {
            out.push(i);
        }
    }
}

/// The chain of project `key` over a tiered route (module docs, "Tiers").
///
/// `weights` are the route's current weights (normally
/// [`crate::weights::tiered_cascade_weights`]), `tiers` its static layout, both by route
/// position like `providers`. Returns a permutation of `0..providers.len()`: first the provider
/// with the smallest `−ln(ui)/wi` among positive weights, then the others ordered by (weight 0
/// last, priority tier, `−ln(ui)/vi` with the static weight `vi`, configured position).
/// Positions missing from `tiers` count as weight 0 in the last tier. Deterministic in `(key,
/// provider names, weights, tiers)`; the draw `ui` is the one [`sticky_chain`] uses.
pub fn tiered_chain(key: &str, providers: &[&str], weights: &[f64], tiers: &Tiers) -> Vec<usize> {
    let mut out = Vec::with_capacity(providers.len());
    tiered_chain_into(key, providers, weights, tiers, &mut out);
    out
}

/// [`tiered_chain`] writing into a caller-owned buffer (cleared first).
pub fn tiered_chain_into(
    key: &str,
    providers: &[&str],
    weights: &[f64],
    tiers: &Tiers,
    out: &mut Vec<usize>,
) {
    out.clear();
    let seed = key_hash(key);
    let units: SmallVec<[f64; INLINE_PROVIDERS]> = providers
        .iter()
        .map(|name| unit_open(xxh3_64_with_seed(name.as_bytes(), seed)))
        .collect();
    let head = (0..providers.len())
        .filter_map(|i| {
            let w = weights.get(i).copied().and_then(usable_weight)?;
            Some((-units[i].ln() / w, i))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, i)| i);
    // (weight 0, tier, race key over the static weight, position)
    let mut rest: SmallVec<[(bool, u32, f64, usize); INLINE_PROVIDERS]> = (0..providers.len())
        .filter(|&i| Some(i) != head)
        .map(|i| {
            let v = tiers.weight().get(i).copied().unwrap_or(0);
            let tier = tiers.priority().get(i).copied().unwrap_or(u32::MAX);
            let race = if v > 0 {
                -units[i].ln() / f64::from(v)
            } else {
                0.0
            };
            (v == 0, tier, race, i)
        })
        .collect();
    rest.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.total_cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    out.extend(head);
    out.extend(rest.iter().map(|r| r.3));
}

/// The chain of a route: [`tiered_chain`] when it has [`Tiers`], else [`sticky_chain`].
pub fn route_chain(
    key: &str,
    providers: &[&str],
    weights: &[f64],
    tiers: Option<&Tiers>,
) -> Vec<usize> {
    match tiers {
        Some(t) => tiered_chain(key, providers, weights, t),
        None => sticky_chain(key, providers, weights),
    }
}

/// Why a project is moved off the head of its pinned chain ([`ChainPins::move_to_front_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveCause {
    /// The head failed the request (5xx, timeout, transport, an open circuit): the project
    /// stays where it was served, whose cache is now the warm one (field case 22).
    Failure,
    /// The head was full (429, quota, a pause or a reservation refusal): besides the move,
    /// the head is not quiet, which holds back displaced projects returning to it.
    Capacity,
}

/// Records that provider `index` could not hold a project at `now` ([`ChainPins`]'s `unready`).
fn mark_unready(unready: &mut Vec<Instant>, index: usize, now: Instant) {
    if unready.len() <= index {
        unready.resize(index + 1, Instant::ZERO);
    }
    unready[index] = unready[index].max(now);
}

/// The head of project `key`'s chain at full availability: every provider healthy, so the
/// weights are [`crate::weights::route_weights`] of all-ones availabilities (the first provider
/// of a plain priority list; the static-weight race inside the first tier of a tiered route).
/// `None` for an empty route. `O(providers)`; called when a pin is created, not per hit.
pub fn home_head(key: &str, providers: &[&str], tiers: Option<&Tiers>) -> Option<usize> {
    home(key, providers, tiers).map(|(head, _)| head)
}

/// [`home_head`] and the home's cascade weight at full availability.
fn home(key: &str, providers: &[&str], tiers: Option<&Tiers>) -> Option<(usize, f64)> {
    // A plain priority list: full availabilities cascade to [1, 0, …], whose head is the
    // first provider; no second chain to compute for every new pin.
    if tiers.is_none() {
        return (!providers.is_empty()).then_some((0, 1.0));
    }
    let full: SmallVec<[f64; INLINE_PROVIDERS]> = SmallVec::from_elem(1.0, providers.len());
    let weights = crate::weights::route_weights(&full, tiers);
    let head = route_chain(key, providers, &weights, tiers)
        .first()
        .copied()?;
    Some((head, weights.get(head).copied().unwrap_or(0.0)))
}

/// A displaced pin returns home only while the home's current cascade weight is at least this
/// fraction of its weight at full availability: the home has recovered, not merely improved.
pub const RETURN_WEIGHT_FRACTION: f64 = 0.9;

/// A displaced project returns at all only if, while it was away, its home's cascade weight was
/// seen below this fraction of its full weight while another provider of the route had more:
/// the home failed (an outage, a 429 storm that the availability controller
/// counted), as opposed to a home at its capacity, whose weight stays high (0.7-1.0 for a
/// primary held at 60 % of demand, `config/scenarios/primary-60pct`) while it sheds the projects
/// that do not fit. Those stay on their fallback, whose cache is the warm one: sending them back
/// would only be shed again, each bounce a cache miss (measured: affinity 96.5 % instead of
/// 98 % in primary-60pct when every displaced project returned).
pub const HOME_FAILED_FRACTION: f64 = 0.5;

/// Whether the current `weights` say the home (index `home`, full weight `home_weight`) failed
/// on its own ([`HOME_FAILED_FRACTION`]). A fleet-wide collapse, where every availability is
/// low and the cascade falls back to equal weights, singles out no provider and is not a
/// failure of the home. `O(providers)`; evaluated only for displaced pins.
fn home_failed(weights: &[f64], home: usize, home_weight: f64) -> bool {
    let w = weights.get(home).copied().unwrap_or(0.0);
    w < HOME_FAILED_FRACTION * home_weight && weights.iter().any(|&o| o > w)
}

/// The shortest quiet time, as a fraction of the pin duration, before a displaced project
/// returns home. Each project waits `pin × (q + (1 − q) × u)` of quiet at its home, `u` uniform
/// in (0,1) from its key, so the displaced projects return spread over the last three quarters
/// of one pin duration. A provider that keeps shedding (a primary held below its share by a
/// rate limit sheds a project every few seconds) never stays quiet that long and keeps no
/// project bouncing between it and the fallback, each bounce a cache miss.
pub const RETURN_QUIET_MIN: f64 = 0.25;

/// The quiet time at its home after which the displaced project `key` returns
/// ([`RETURN_QUIET_MIN`]).
fn return_stagger(key: &str, pin: Duration) -> Duration {
    let u = unit_open(xxh3_64_with_seed(key.as_bytes(), RETURN_SEED));
    pin.mul_f64(RETURN_QUIET_MIN + (1.0 - RETURN_QUIET_MIN) * u)
}

/// The first provider of `chain` for which `eligible` holds (circuit closed, not paused, healthy
/// for the modality, allowed region…), or `None` when none is. The chain is not re-sampled: an
/// ineligible provider is skipped and keeps its place for later requests.
pub fn first_eligible(chain: &[usize], eligible: impl Fn(usize) -> bool) -> Option<usize> {
    chain.iter().copied().find(|&i| eligible(i))
}

/// The providers of `chain` for which `eligible` holds, in chain order: the dispatch order of
/// one request (first attempt, then fallbacks).
pub fn eligible_in_order<'a, F>(chain: &'a [usize], eligible: F) -> impl Iterator<Item = usize> + 'a
where
    F: Fn(usize) -> bool + 'a,
{
    chain.iter().copied().filter(move |&i| eligible(i))
}

/// Fingerprint of an ordered provider set: chains are lists of indices, so a pin is only valid
/// for the exact names in the exact order it was computed over.
fn provider_set_fingerprint(providers: &[&str]) -> u64 {
    providers.iter().fold(
        xxh3_64_with_seed(&(providers.len() as u64).to_le_bytes(), SET_SEED),
        |h, name| xxh3_64_with_seed(name.as_bytes(), h),
    )
}

/// A [`std::hash::Hasher`] for keys that are already uniform 64-bit fingerprints (a keyed
/// hash of the real key): it returns the `u64` written to it, so a table of fingerprints does
/// not hash them a second time. Other writes are folded in byte by byte, never ignored.
#[derive(Debug, Clone, Copy, Default)]
pub struct FingerprintHasher(u64);

impl std::hash::Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// One pinned chain: 40 bytes, so that with its 8-byte key and the LRU's two links an entry
/// fills one 64-byte allocation (plus a few bytes for the chain itself).
#[derive(Debug, Clone)]
struct Pin {
    /// Provider indices in chain order, one byte each: [`ChainPins`] pins only routes of at
    /// most 256 providers (RoutingPolicy allows 64).
    chain: Box<[u8]>,
    /// Idle expiry as nanoseconds since the clock's origin ([`Instant`] is 16 bytes); slides
    /// with every hit unless the cache was built with fixed pins.
    expires_ns: u64,
    /// The home's cascade weight at full availability (1.0 for the head of a priority list).
    home_weight: f64,
    /// The provider set and tiers the chain was computed over, 32 bits of their fingerprint;
    /// a pin whose indices do not fit the current set is never used whatever this says.
    provider_set: u32,
    /// The project's home: the head of its chain at full availability (every provider healthy,
    /// the route's static tiers and weights), where it belongs once every provider is back.
    home: u8,
    /// The pinned head is not `home`: the project was moved by a failover or sampled while
    /// the weights were degraded.
    displaced: bool,
    /// While displaced, the home was seen failing (its weight below [`HOME_FAILED_FRACTION`]
    /// of full): the project left because the home broke, not because it was full, and is
    /// re-sampled once the home is ready again.
    home_failed: bool,
    /// The pin was created by a return home ([`ChainPins::route_chain`]). If the home sheds it
    /// again for capacity, the home could not take the returns yet (a returning project
    /// re-sends its whole context, and a burst of them can exceed the home's input-token
    /// rate): the project stays eligible to return.
    returned: bool,
}

/// Most providers a pinned route may have (indices are stored as `u8`).
const MAX_PINNED_PROVIDERS: usize = 256;

impl Pin {
    fn expires(&self) -> Instant {
        Instant::from_origin(Duration::from_nanos(self.expires_ns))
    }

    fn set_expires(&mut self, at: Instant) {
        self.expires_ns = nanos(at);
    }

    fn home(&self) -> usize {
        usize::from(self.home)
    }

    fn chain(&self) -> Vec<usize> {
        self.chain.iter().map(|&i| usize::from(i)).collect()
    }

    /// Whether every index of the chain names one of `n` providers.
    fn fits(&self, n: usize) -> bool {
        self.chain.iter().all(|&i| usize::from(i) < n)
    }
}

fn nanos(at: Instant) -> u64 {
    u64::try_from(at.since_origin().as_nanos()).unwrap_or(u64::MAX)
}

/// A chain as one byte per index, `None` when an index does not fit a byte.
fn chain_bytes(chain: &[usize]) -> Option<Box<[u8]>> {
    chain.iter().map(|&i| u8::try_from(i).ok()).collect()
}

/// Default affinity duration: the sticky-chain article pins chains "for a few minutes"; 5 min is
/// also the default lifetime of a prompt-cache entry at the major vendors.
pub const DEFAULT_PIN: Duration = Duration::from_secs(300);

/// Bounded cache of project key → pinned chain (DESIGN §4.3).
///
/// Bounded by entry count with least-recently-used eviction (`lru` crate); expiry is checked
/// against the `now` the caller passes, so no clock is read. By default a hit extends the pin
/// (sliding expiry: the affinity lasts while the project keeps talking, like a prompt cache whose
/// TTL refreshes on every read, field case 22); [`ChainPins::with_refresh_on_hit`]`(false)` gives
/// fixed pins that expire `pin` after they were set, after which the chain is re-sampled from the
/// current weights (the article's behaviour: active projects re-balance every `pin`).
///
/// **Displaced pins return** (issue 18 item 3). A sliding pin that never expires while it is
/// used would keep a project on its fallback forever after an outage, although the weights say
/// the recovered provider should serve it again. So each pin remembers the project's *home*, the
/// head its chain has at full availability ([`crate::weights::route_weights`] of all-ones
/// availabilities, the route's tiers applied). A pin whose head is not the home (moved by
/// [`ChainPins::move_to_front`], or sampled from degraded weights) is *displaced*. Only a
/// project displaced from a home that *failed* returns: while it was away, the home's weight
/// was seen below [`HOME_FAILED_FRACTION`] of full while a peer had more. A project shed by a
/// home that was merely full (its weight stays high while it rate-limits) stays on the
/// fallback, whose cache is the warm one. The cache keeps, per provider, the last instant it saw
/// the provider not ready: its weight below [`RETURN_WEIGHT_FRACTION`] of full, or a
/// [`MoveCause::Capacity`] move off it. A returning project is re-sampled from the current
/// weights (which puts it back home) at its first hit once the home has been ready for the
/// project's stagger, `pin × (0.25 + 0.75 u)` with `u` uniform from its key
/// ([`RETURN_QUIET_MIN`]). So after a recovery the displaced projects come back spread over one
/// pin duration, not as one mass move of cold-cache prefills onto the home; a capacity shed at
/// the home holds the remaining returns back; a random 5xx does not. Pins at their home keep
/// sliding, so healthy projects never lose their cache to this rule. Measured in
/// `config/scenarios/primary-outage.yaml` (docs/simulation.md): the primary's share is back to
/// 90 % of its pre-outage share within pin + 2 intervals of its weight's return on 7 of 9
/// seeds; primary-60pct is unchanged on 8 of 9 seeds.
///
/// A pin is used only while the provider set (names and order) is the one it was computed over;
/// a config change recomputes it. Per router replica: replicas agree on fresh chains (rendezvous)
/// but a [`ChainPins::move_to_front`] is local to the replica that saw the failure; to make a
/// failover stick across replicas, share the moved chain and install it with
/// [`ChainPins::pin`].
///
/// The map holds a 64-bit fingerprint of each project key, `std`'s SipHash-1-3 with random keys
/// drawn per cache, not the key: project keys come from client headers, so the cache must not be
/// open to hash flooding or to a key chosen to collide with another project's, and an entry's
/// size no longer depends on its key's length (measured: 3.0 MiB less resident memory per
/// 100,000 pinned projects than keying by the string, docs/benchmarks-2026-12-07-memory.md).
/// (Only the rendezvous hash has to agree across processes, and it does not live here.)
#[derive(Debug)]
pub struct ChainPins {
    /// Keyed by the project key's [`ChainPins::fingerprint`], not the key itself: 8 bytes per
    /// entry instead of a `String` and its heap copy of the key.
    cache: LruCache<u64, Pin, BuildHasherDefault<FingerprintHasher>>,
    /// The per-cache random keys of the fingerprints (`std`'s SipHash-1-3).
    keys: RandomState,
    pin: Duration,
    refresh_on_hit: bool,
    /// Per provider index: the last instant a project could not be at that provider, its home
    /// (a move away from it, or a displaced pin hit while its weight was below
    /// [`RETURN_WEIGHT_FRACTION`] of full). Indices of the route's current provider set; a
    /// config change at worst delays a return by one pin duration.
    unready: Vec<Instant>,
}

impl ChainPins {
    /// A cache of at most `capacity` projects (0 is treated as 1) pinning chains for `pin`.
    pub fn new(capacity: usize, pin: Duration) -> Self {
        ChainPins {
            cache: LruCache::with_hasher(
                NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
                BuildHasherDefault::default(),
            ),
            keys: RandomState::new(),
            pin,
            refresh_on_hit: true,
            unready: Vec::new(),
        }
    }

    /// Chooses sliding expiry (`true`, the default: every hit pins for another `pin`) or fixed
    /// expiry (`false`: a pin lasts `pin` from when it was set or moved).
    pub fn with_refresh_on_hit(mut self, refresh: bool) -> Self {
        self.refresh_on_hit = refresh;
        self
    }

    /// The affinity duration.
    pub fn pin_duration(&self) -> Duration {
        self.pin
    }

    /// The 64-bit key under which `key`'s pin is held: SipHash-1-3 with this cache's random
    /// keys. Two projects share a pin with probability 2⁻⁶⁴ per pair (about 3 × 10⁻¹⁰ for
    /// 100,000 pinned projects), and since the keys are secret a client cannot choose a
    /// project key that lands on another project's pin.
    fn fingerprint(&self, key: &str) -> u64 {
        self.keys.hash_one(key)
    }

    /// The chain for project `key`: the pinned one when it is unexpired at `now` and was computed
    /// over the same `providers` (same names, same order); otherwise [`sticky_chain`] over
    /// `weights`, which is then pinned until `now + pin`. Returns indices into `providers`.
    pub fn chain(
        &mut self,
        key: &str,
        providers: &[&str],
        weights: &[f64],
        now: Instant,
    ) -> Vec<usize> {
        self.route_chain(key, providers, weights, None, now)
    }

    /// The affinity move after a request was served below the head of `key`'s chain (the
    /// dispatch machine's [`crate::dispatch::Fleet::move_to_front`]): moves `member` to the
    /// front unless it already is there or it is a weight-0 standby of a tiered route (a
    /// standby serves only while nothing else can, so pinned projects must not stay on it).
    /// Returns `true` for an affinity break (the pin's head changed).
    pub fn route_move_to_front(
        &mut self,
        key: &str,
        member: usize,
        tiers: Option<&Tiers>,
        cause: MoveCause,
        now: Instant,
    ) -> bool {
        if tiers.is_some_and(|t| t.is_standby(member)) || self.head(key, now) == Some(member) {
            return false;
        }
        self.move_to_front_for(key, member, cause, now)
    }

    /// [`ChainPins::chain`] for a route that may have [`Tiers`]: a fresh chain is
    /// [`route_chain`] (the tiered chain when `tiers` is given), and a pin is used only while
    /// the tiers are the ones it was computed with (a changed priority or weight re-samples).
    pub fn route_chain(
        &mut self,
        key: &str,
        providers: &[&str],
        weights: &[f64],
        tiers: Option<&Tiers>,
        now: Instant,
    ) -> Vec<usize> {
        // A pin is also tied to the tier layout: a provider set to weight 0 ("no traffic for
        // now") must not stay at the head of the chains pinned before the change.
        let provider_set = tiers.map_or(provider_set_fingerprint(providers), |t| {
            t.priority()
                .iter()
                .chain(t.weight())
                .fold(provider_set_fingerprint(providers), |h, v| {
                    xxh3_64_with_seed(&v.to_le_bytes(), h)
                })
        });
        let provider_set = provider_set as u32;
        let mut returning = false;
        let id = self.fingerprint(key);
        if let Some(pin) = self.cache.get_mut(&id)
            && pin.provider_set == provider_set
            && now < pin.expires()
            && pin.fits(providers.len())
        {
            let home = pin.home();
            let due_home = pin.displaced && {
                let w = weights.get(home).copied().unwrap_or(0.0);
                pin.home_failed |= home_failed(weights, home, pin.home_weight);
                let ready = w >= RETURN_WEIGHT_FRACTION * pin.home_weight;
                if !ready {
                    mark_unready(&mut self.unready, home, now);
                }
                let quiet = self
                    .unready
                    .get(home)
                    .map_or(Duration::MAX, |&t| now.saturating_since(t));
                pin.home_failed && ready && quiet >= return_stagger(key, self.pin)
            };
            if !due_home {
                if self.refresh_on_hit {
                    pin.set_expires(now + self.pin);
                }
                return pin.chain();
            }
            returning = true;
        }
        let chain = route_chain(key, providers, weights, tiers);
        let head = chain.first().copied().unwrap_or(0);
        let (home, home_weight) = home(key, providers, tiers).unwrap_or((head, 1.0));
        let home_now = weights.get(home).copied().unwrap_or(0.0);
        if head != home && home_now < RETURN_WEIGHT_FRACTION * home_weight {
            mark_unready(&mut self.unready, home, now);
        }
        let (Some(bytes), Ok(home_byte)) = (chain_bytes(&chain), u8::try_from(home)) else {
            // More providers than a pin can name: no affinity, every turn is sampled afresh.
            self.cache.pop(&id);
            return chain;
        };
        let pin = Pin {
            chain: bytes,
            provider_set,
            expires_ns: nanos(now + self.pin),
            home: home_byte,
            home_weight,
            displaced: head != home,
            home_failed: head != home && home_failed(weights, home, home_weight),
            returned: returning && head == home,
        };
        match self.cache.get_mut(&id) {
            Some(slot) => *slot = pin,
            None => {
                self.cache.put(id, pin);
            }
        }
        chain
    }

    /// Moves `provider_index` to the front of project `key`'s pinned chain and re-pins it until
    /// `now + pin`, so that after a failover the following turns stay on the provider that now
    /// holds the project's prompt cache instead of flipping back (field case 22, run 2).
    ///
    /// Returns `false` (and changes nothing) when the key has no pin or the index is not in its
    /// chain; call [`ChainPins::chain`] for the turn first. An expired pin is revived: the caller
    /// has just served the project from it.
    pub fn move_to_front(&mut self, key: &str, provider_index: usize, now: Instant) -> bool {
        self.move_to_front_for(key, provider_index, MoveCause::Failure, now)
    }

    /// [`ChainPins::move_to_front`] with the reason the head did not serve. A
    /// [`MoveCause::Capacity`] move off the project's home marks the home not quiet
    /// (displaced projects wait for quiet before they return), and a project that had just
    /// returned home and is shed again for capacity stays eligible to return.
    pub fn move_to_front_for(
        &mut self,
        key: &str,
        provider_index: usize,
        cause: MoveCause,
        now: Instant,
    ) -> bool {
        let pin_for = self.pin;
        let id = self.fingerprint(key);
        let Some(pin) = self.cache.get_mut(&id) else {
            return false;
        };
        let Some(pos) = pin
            .chain
            .iter()
            .position(|&i| usize::from(i) == provider_index)
        else {
            return false;
        };
        let shed = pos > 0 && cause == MoveCause::Capacity && pin.chain[0] == pin.home;
        if shed {
            mark_unready(&mut self.unready, pin.home(), now);
        }
        let shed_returnee = shed && pin.returned;
        pin.chain[..=pos].rotate_right(1);
        pin.set_expires(now + pin_for);
        pin.displaced = provider_index != pin.home();
        pin.home_failed = pin.displaced && (pin.home_failed || shed_returnee);
        true
    }

    /// Installs `chain` as project `key`'s pin over `providers` until `now + pin`, replacing any
    /// pin it had; the installed head counts as the project's home (the pin slides and never
    /// returns elsewhere by itself). For replicas that share affinity moves (e.g. a failover learned from another
    /// replica through a shared store): [`ChainPins::move_to_front`] alone is local to the
    /// replica that saw the failure. Returns `false` (and changes nothing) unless `chain` is a
    /// permutation of `0..providers.len()`.
    pub fn pin(&mut self, key: &str, providers: &[&str], chain: Vec<usize>, now: Instant) -> bool {
        let mut seen: SmallVec<[bool; INLINE_PROVIDERS]> =
            SmallVec::from_elem(false, providers.len());
        let is_permutation = chain.len() == providers.len()
            && chain
                .iter()
                .all(|&i| seen.get_mut(i).is_some_and(|s| !std::mem::replace(s, true)));
        if !is_permutation || providers.len() > MAX_PINNED_PROVIDERS {
            return false;
        }
        let Some(bytes) = chain_bytes(&chain) else {
            return false;
        };
        let pin = Pin {
            home: bytes.first().copied().unwrap_or(0),
            home_weight: 0.0,
            chain: bytes,
            provider_set: provider_set_fingerprint(providers) as u32,
            expires_ns: nanos(now + self.pin),
            displaced: false,
            home_failed: false,
            returned: false,
        };
        self.cache.put(self.fingerprint(key), pin);
        true
    }

    /// The pinned chain of `key` if one is unexpired at `now` (does not refresh or compute).
    pub fn peek(&self, key: &str, now: Instant) -> Option<Vec<usize>> {
        self.cache
            .peek(&self.fingerprint(key))
            .filter(|pin| now < pin.expires())
            .map(Pin::chain)
    }

    /// The head of `key`'s unexpired pinned chain, if any.
    fn head(&self, key: &str, now: Instant) -> Option<usize> {
        self.cache
            .peek(&self.fingerprint(key))
            .filter(|pin| now < pin.expires())
            .and_then(|pin| pin.chain.first().map(|&i| usize::from(i)))
    }

    /// Whether `key` has an unexpired pin at `now` (does not refresh or compute).
    pub fn is_pinned(&self, key: &str, now: Instant) -> bool {
        self.cache
            .peek(&self.fingerprint(key))
            .is_some_and(|pin| now < pin.expires())
    }

    /// Drops the pin of `key`, if any.
    pub fn remove(&mut self, key: &str) {
        self.cache.pop(&self.fingerprint(key));
    }

    /// Drops every pin expired at `now`; returns how many were dropped. `O(len)`: call it from a
    /// housekeeping tick, not per request (expired pins are also replaced lazily on lookup and
    /// evicted by LRU order when the cache is full).
    pub fn purge_expired(&mut self, now: Instant) -> usize {
        let expired: Vec<u64> = self
            .cache
            .iter()
            .filter(|(_, pin)| now >= pin.expires())
            .map(|(&id, _)| id)
            .collect();
        for id in &expired {
            self.cache.pop(id);
        }
        expired.len()
    }

    /// Number of pins held (expired ones included until replaced, purged or evicted).
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether no pin is held.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Maximum number of pins.
    pub fn capacity(&self) -> usize {
        self.cache.cap().get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P5: [&str; 5] = ["anthropic", "vertex", "bedrock", "openai", "azure"];

    #[test]
    fn sticky_chain_same_inputs_same_chain() {
        let w = [0.5, 0.3, 0.15, 0.05, 0.0];
        let a = sticky_chain("project-42", &P5, &w);
        let b = sticky_chain("project-42", &P5, &w);
        assert_eq!(a, b);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        // The zero-weight provider is last.
        assert_eq!(a[4], 4);
    }

    #[test]
    fn sticky_chain_zero_weights_configured_order_at_tail() {
        let chain = sticky_chain("k", &P5, &[0.0, 1.0, 0.0, f64::NAN, -3.0]);
        assert_eq!(chain, vec![1, 0, 2, 3, 4]);
        // Missing weights count as zero.
        assert_eq!(sticky_chain("k", &P5, &[0.0, 1.0]), vec![1, 0, 2, 3, 4]);
        assert_eq!(sticky_chain("k", &[], &[1.0]), Vec::<usize>::new());
    }

    #[test]
    fn rendezvous_unit_known_values_stable() {
        // Pinned outputs: if these change, every router replica running an older build would
        // disagree with a newer one about every project's chain.
        let u = rendezvous_unit("project-42", "anthropic");
        assert!(u > 0.0 && u < 1.0);
        let again = rendezvous_unit("project-42", "anthropic");
        assert_eq!(u.to_bits(), again.to_bits());
        assert_ne!(
            rendezvous_unit("project-42", "anthropic"),
            rendezvous_unit("project-42", "vertex")
        );
    }

    #[test]
    fn unit_open_extremes_strictly_inside() {
        assert!(unit_open(0) > 0.0);
        assert!(unit_open(u64::MAX) < 1.0);
        assert!((-unit_open(u64::MAX).ln()) > 0.0);
    }

    #[test]
    fn sticky_chain_removing_provider_keeps_relative_order() {
        let w = [0.2; 5];
        for k in 0..200 {
            let key = format!("p{k}");
            let full = sticky_chain(&key, &P5, &w);
            // Drop "bedrock" (index 2): the others keep their relative order.
            let fewer = ["anthropic", "vertex", "openai", "azure"];
            let sub = sticky_chain(&key, &fewer, &w[..4]);
            let expected: Vec<&str> = full
                .iter()
                .map(|&i| P5[i])
                .filter(|n| *n != "bedrock")
                .collect();
            let got: Vec<&str> = sub.iter().map(|&i| fewer[i]).collect();
            assert_eq!(got, expected, "key {key}");
        }
    }

    #[test]
    fn first_eligible_skips_without_resampling() {
        let chain = [3, 1, 0, 2];
        assert_eq!(first_eligible(&chain, |i| i != 3), Some(1));
        assert_eq!(first_eligible(&chain, |_| false), None);
        let order: Vec<usize> = eligible_in_order(&chain, |i| i != 1).collect();
        assert_eq!(order, vec![3, 0, 2]);
    }

    #[test]
    fn chain_pins_hit_returns_pinned_despite_new_weights() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        let names = ["a", "b"];
        let t0 = Instant::ZERO;
        let first = pins.chain("k", &names, &[1.0, 0.0], t0);
        assert_eq!(first, vec![0, 1]);
        // Weights flipped, but the pin holds.
        let again = pins.chain("k", &names, &[0.0, 1.0], t0 + Duration::from_secs(30));
        assert_eq!(again, vec![0, 1]);
        assert_eq!(pins.len(), 1);
    }

    #[test]
    fn chain_pins_expired_recomputes() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        let names = ["a", "b"];
        pins.chain("k", &names, &[1.0, 0.0], Instant::ZERO);
        let later = pins.chain("k", &names, &[0.0, 1.0], Instant::from_millis(60_000));
        assert_eq!(later, vec![1, 0]);
    }

    #[test]
    fn chain_pins_sliding_hit_extends_fixed_does_not() {
        let names = ["a", "b"];
        let s = Duration::from_secs;
        let t = Instant::ZERO;
        let mut sliding = ChainPins::new(10, s(60));
        let mut fixed = ChainPins::new(10, s(60)).with_refresh_on_hit(false);
        for pins in [&mut sliding, &mut fixed] {
            pins.chain("k", &names, &[1.0, 0.0], t);
            pins.chain("k", &names, &[0.0, 1.0], t + s(50));
        }
        assert_eq!(
            sliding.chain("k", &names, &[0.0, 1.0], t + s(100)),
            vec![0, 1]
        );
        assert_eq!(
            fixed.chain("k", &names, &[0.0, 1.0], t + s(100)),
            vec![1, 0]
        );
    }

    #[test]
    fn chain_pins_provider_set_change_recomputes() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        pins.chain("k", &["a", "b"], &[1.0, 0.0], Instant::ZERO);
        let c = pins.chain("k", &["b", "a"], &[1.0, 0.0], Instant::from_millis(1));
        assert_eq!(c, vec![0, 1]);
        let c = pins.chain(
            "k",
            &["b", "a", "c"],
            &[0.0, 0.0, 1.0],
            Instant::from_millis(2),
        );
        assert_eq!(c, vec![2, 0, 1]);
    }

    #[test]
    fn a_pin_is_40_bytes_so_an_lru_entry_fits_64() {
        // Key (8) + pin + the LRU's prev/next links (16): jemalloc's 64-byte class.
        assert_eq!(std::mem::size_of::<Pin>(), 40);
    }

    #[test]
    fn routes_beyond_256_providers_are_served_unpinned() {
        let names: Vec<String> = (0..300).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut weights = vec![0.0; 300];
        weights[299] = 1.0;
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        let chain = pins.chain("k", &names, &weights, Instant::ZERO);
        assert_eq!(chain.len(), 300);
        assert_eq!(chain[0], 299);
        assert!(!pins.is_pinned("k", Instant::ZERO));
        assert!(!pins.pin("k", &names, chain, Instant::ZERO));
    }

    #[test]
    fn chain_pins_capacity_evicts_least_recent() {
        let mut pins = ChainPins::new(2, Duration::from_secs(60));
        let names = ["a", "b"];
        let w = [0.5, 0.5];
        let t = Instant::ZERO;
        pins.chain("k1", &names, &w, t);
        pins.chain("k2", &names, &w, t);
        pins.chain("k1", &names, &w, t);
        pins.chain("k3", &names, &w, t);
        assert_eq!(pins.len(), 2);
        assert!(pins.peek("k2", t).is_none());
        assert!(pins.peek("k1", t).is_some());
        assert_eq!(ChainPins::new(0, DEFAULT_PIN).capacity(), 1);
    }

    #[test]
    fn chain_pins_move_to_front_keeps_rest_order() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        let names = ["a", "b", "c", "d"];
        pins.chain("k", &names, &[0.0; 4], Instant::ZERO);
        assert!(pins.move_to_front("k", 2, Instant::from_millis(5)));
        assert_eq!(
            pins.peek("k", Instant::from_millis(6)),
            Some(vec![2, 0, 1, 3])
        );
        assert!(!pins.move_to_front("k", 9, Instant::from_millis(7)));
        assert!(!pins.move_to_front("other", 0, Instant::from_millis(7)));
    }

    /// Hits every 10 s from `from` until `until` (exclusive, seconds); the chains returned.
    fn hit_every_10s(
        pins: &mut ChainPins,
        weights: &[f64],
        from: u64,
        until: u64,
    ) -> Vec<Vec<usize>> {
        (from..until)
            .step_by(10)
            .map(|t| pins.chain("k", &["a", "b"], weights, Instant::from_millis(t * 1000)))
            .collect()
    }

    /// Hits project "k" every 100 ms from `from` (seconds) on with `weights` until its head is
    /// `head`; the instant of that hit, in ms (panics after an hour).
    fn hits_until_head(pins: &mut ChainPins, weights: &[f64], from: u64, head: usize) -> u64 {
        (from * 1000..from * 1000 + 3_600_000)
            .step_by(100)
            .find(|&ms| pins.chain("k", &["a", "b"], weights, Instant::from_millis(ms))[0] == head)
            .expect("the project never reached the head")
    }

    /// `return_stagger("k", 60 s)` in ms, the quiet time "k" waits for at its home.
    fn stagger_k_ms() -> u64 {
        return_stagger("k", Duration::from_secs(60)).as_millis() as u64
    }

    #[test]
    fn return_stagger_spreads_over_the_last_three_quarters_of_the_pin() {
        let pin = Duration::from_secs(60);
        let mut s: Vec<f64> = (0..4000)
            .map(|k| return_stagger(&format!("k{k}"), pin).as_secs_f64())
            .collect();
        s.sort_by(f64::total_cmp);
        assert!(s[0] >= 15.0 && s[3999] <= 60.0, "{} .. {}", s[0], s[3999]);
        // Uniform over [15, 60]: quartiles at about 26.25, 37.5 and 48.75 s.
        for (q, want) in [(1000, 26.25), (2000, 37.5), (3000, 48.75)] {
            assert!(
                (s[q] - want).abs() < 1.5,
                "quantile {q}: {} vs {want}",
                s[q]
            );
        }
    }

    #[test]
    fn chain_pins_moved_pin_returns_home_after_its_stagger_of_quiet() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        assert_eq!(
            pins.chain("k", &["a", "b"], &[1.0, 0.0], Instant::ZERO),
            vec![0, 1]
        );
        // A failover at 5 s moves the project to b; a fails (weight 0) until 30 s, last seen
        // so at 20 s, then is back at full weight and quiet: the project returns at 20 s + its
        // stagger.
        assert!(pins.move_to_front("k", 1, Instant::from_millis(5_000)));
        let during = hit_every_10s(&mut pins, &[0.0, 1.0], 10, 30);
        assert!(during.iter().all(|c| c == &[1, 0]), "{during:?}");
        let back = hits_until_head(&mut pins, &[1.0, 0.0], 30, 0);
        assert_eq!(back, (20_000 + stagger_k_ms()).div_ceil(100) * 100);
        // Home again: the pin slides as before, whatever the weights do.
        let after = hit_every_10s(&mut pins, &[0.0, 1.0], back / 1000 + 1, 400);
        assert!(after.iter().all(|c| c == &[0, 1]), "{after:?}");
    }

    #[test]
    fn chain_pins_project_shed_by_a_full_home_stays_on_its_fallback() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        pins.chain("k", &["a", "b"], &[1.0, 0.0], Instant::ZERO);
        // Moved off a while a keeps a high weight (a rate limit is not a failure; 0.85 is the
        // lowest a primary at 60 % of demand gets): b holds the warm cache, the pin slides.
        assert!(pins.move_to_front("k", 1, Instant::from_millis(5_000)));
        let chains = hit_every_10s(&mut pins, &[0.85, 0.15], 10, 300);
        assert!(chains.iter().all(|c| c == &[1, 0]), "{chains:?}");
        let chains = hit_every_10s(&mut pins, &[1.0, 0.0], 300, 900);
        assert!(chains.iter().all(|c| c == &[1, 0]), "{chains:?}");
    }

    #[test]
    fn chain_pins_displaced_pin_stays_while_the_home_is_still_down() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        pins.chain("k", &["a", "b"], &[1.0, 0.0], Instant::ZERO);
        assert!(pins.move_to_front("k", 1, Instant::from_millis(5_000)));
        // a is still at weight 0 long after the pin duration: the project stays on b.
        let chains = hit_every_10s(&mut pins, &[0.0, 1.0], 10, 200);
        assert!(chains.iter().all(|c| c == &[1, 0]), "{chains:?}");
        // Partly back (held at 60 %): not recovered, nothing moves; last seen unready at 390 s.
        let chains = hit_every_10s(&mut pins, &[0.6, 0.4], 200, 400);
        assert!(chains.iter().all(|c| c == &[1, 0]), "{chains:?}");
        let back = hits_until_head(&mut pins, &[0.95, 0.05], 400, 0);
        assert_eq!(back, (390_000 + stagger_k_ms()).div_ceil(100) * 100);
    }

    #[test]
    fn chain_pins_a_home_that_keeps_shedding_keeps_no_project_back() {
        let mut pins = ChainPins::new(100, Duration::from_secs(60));
        let names = ["a", "b"];
        pins.chain("k", &names, &[1.0, 0.0], Instant::ZERO);
        assert!(pins.move_to_front("k", 1, Instant::from_millis(1_000)));
        // a failed briefly, then is back at full weight, but another project is moved off it
        // every 10 s: it never has 15 s of quiet, and "k" stays on b for ten minutes.
        assert_eq!(
            pins.chain("k", &names, &[0.0, 1.0], Instant::from_millis(2_000))[0],
            1
        );
        for t in (10..600).step_by(10) {
            let other = format!("other{t}");
            let at = Instant::from_millis(t * 1000);
            pins.chain(&other, &names, &[1.0, 0.0], at);
            assert!(pins.move_to_front_for(&other, 1, MoveCause::Capacity, at));
            let at = Instant::from_millis(t * 1000 + 5_000);
            assert_eq!(
                pins.chain("k", &names, &[1.0, 0.0], at),
                vec![1, 0],
                "at {t} s"
            );
        }
        // The shedding stops at 590 s: the project returns after its stagger of quiet.
        let back = hits_until_head(&mut pins, &[1.0, 0.0], 600, 0);
        assert_eq!(back, (590_000 + stagger_k_ms()).div_ceil(100) * 100);
    }

    #[test]
    fn chain_pins_pin_sampled_from_degraded_weights_returns_when_they_recover() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        // A new project while a is down: its chain heads b, which is not its home.
        let during = hit_every_10s(&mut pins, &[0.0, 1.0], 0, 30);
        assert!(during.iter().all(|c| c == &[1, 0]), "{during:?}");
        // Last seen unready at 20 s; a is back from 30 s.
        let back = hits_until_head(&mut pins, &[1.0, 0.0], 30, 0);
        assert_eq!(back, (20_000 + stagger_k_ms()).div_ceil(100) * 100);
    }

    #[test]
    fn chain_pins_move_back_home_clears_the_return() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        pins.chain("k", &["a", "b"], &[1.0, 0.0], Instant::ZERO);
        assert!(pins.move_to_front("k", 1, Instant::from_millis(1_000)));
        assert!(pins.move_to_front("k", 0, Instant::from_millis(2_000)));
        // At home: sliding, so degraded weights do not move it even long after the moves.
        let chains = hit_every_10s(&mut pins, &[0.0, 1.0], 10, 300);
        assert!(chains.iter().all(|c| c == &[0, 1]), "{chains:?}");
    }

    #[test]
    fn home_head_is_the_full_availability_head() {
        assert_eq!(home_head("k", &["a", "b", "c"], None), Some(0));
        assert_eq!(home_head("k", &[], None), None);
        // One tier of two equal providers: the home is the rendezvous race, about half each.
        let t = tiers(&[Some(1), Some(1)], &[Some(1), Some(1)]);
        let homes: Vec<usize> = (0..1000)
            .map(|k| home_head(&format!("k{k}"), &["p0", "p1"], Some(&t)).unwrap())
            .collect();
        let on_p1 = homes.iter().filter(|&&h| h == 1).count();
        assert!((400..600).contains(&on_p1), "{on_p1} of 1000 at home on p1");
        // A project whose home is p1, moved to p0, goes back to p1 after its stagger: p1's
        // weight 0.5 is its full weight in a tier of two.
        let k = (0..1000)
            .map(|k| format!("k{k}"))
            .find(|k| home_head(k, &["p0", "p1"], Some(&t)) == Some(1))
            .unwrap();
        // Rounded up: the quiet time must reach the stagger, which has sub-millisecond digits.
        let stagger = return_stagger(&k, Duration::from_secs(60))
            .as_micros()
            .div_ceil(1000) as u64;
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        let (w, names) = ([0.5, 0.5], ["p0", "p1"]);
        let at = Instant::from_millis;
        assert_eq!(pins.route_chain(&k, &names, &w, Some(&t), at(0))[0], 1);
        assert!(pins.route_move_to_front(&k, 0, Some(&t), MoveCause::Failure, at(1_000)));
        // p1 fails (all weight on p0) at 2 s, then is back at its full 0.5.
        let failing = [1.0, 0.0];
        assert_eq!(
            pins.route_chain(&k, &names, &failing, Some(&t), at(2_000))[0],
            0
        );
        assert_eq!(
            pins.route_chain(&k, &names, &w, Some(&t), at(2_000 + stagger - 1))[0],
            0
        );
        assert_eq!(
            pins.route_chain(&k, &names, &w, Some(&t), at(2_000 + stagger))[0],
            1
        );
    }

    #[test]
    fn chain_pins_pin_installs_only_permutations() {
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        let names = ["a", "b", "c"];
        let t = Instant::ZERO;
        assert!(!pins.pin("k", &names, vec![0, 0, 1], t));
        assert!(!pins.pin("k", &names, vec![0, 1], t));
        assert!(!pins.pin("k", &names, vec![0, 1, 3], t));
        assert!(pins.is_empty());
        assert!(pins.pin("k", &names, vec![2, 0, 1], t));
        assert_eq!(pins.chain("k", &names, &[1.0, 0.0, 0.0], t), vec![2, 0, 1]);
        // A different provider set ignores the installed pin.
        assert_eq!(pins.chain("k", &["a", "b"], &[1.0, 0.0], t), vec![0, 1]);
    }

    #[test]
    fn chain_pins_purge_expired_drops_only_expired() {
        let mut pins = ChainPins::new(10, Duration::from_secs(10));
        let names = ["a"];
        pins.chain("old", &names, &[1.0], Instant::ZERO);
        pins.chain("new", &names, &[1.0], Instant::from_millis(8_000));
        assert_eq!(pins.purge_expired(Instant::from_millis(12_000)), 1);
        assert_eq!(pins.len(), 1);
        pins.remove("new");
        assert!(pins.is_empty());
    }

    fn tiers(priority: &[Option<u32>], weight: &[Option<u32>]) -> Tiers {
        let names: Vec<String> = (0..priority.len()).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Tiers::from_spec(&names, priority, weight).unwrap().unwrap()
    }

    #[test]
    fn tiered_chain_head_by_weights_rest_by_tier_weight_zero_last() {
        let names = ["a", "b", "c", "z"];
        // a, b and z in tier 0 (z weight 0), c in tier 1.
        let t = tiers(
            &[Some(0), Some(0), Some(1), Some(0)],
            &[Some(7), Some(3), None, Some(0)],
        );
        let w = crate::weights::tiered_cascade_weights(&[1.0; 4], &t);
        for k in 0..500 {
            let chain = tiered_chain(&format!("k{k}"), &names, &w, &t);
            let mut sorted = chain.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3]);
            // Head in tier 0, then the other tier-0 member, then c, then z.
            assert!(chain[0] == 0 || chain[0] == 1, "{chain:?}");
            assert_eq!(&chain[1..], &[1 - chain[0], 2, 3], "{chain:?}");
        }
        // A tier-1 head (tier 0 has no weight left) falls back to tier 0 in weight order.
        let chain = tiered_chain("k", &names, &[0.0, 0.0, 1.0, 0.0], &t);
        assert_eq!(chain[0], 2);
        assert_eq!(chain[3], 3);
    }

    #[test]
    fn route_chain_without_tiers_is_sticky_chain() {
        let w = [0.5, 0.3, 0.15, 0.05, 0.0];
        for k in 0..100 {
            let key = format!("p{k}");
            assert_eq!(
                route_chain(&key, &P5, &w, None),
                sticky_chain(&key, &P5, &w)
            );
        }
    }

    #[test]
    fn chain_pins_tier_change_recomputes() {
        let names = ["a", "b"];
        let t = |wa| Tiers::from_spec(&names, &[None, None], &[Some(wa), Some(1)]).unwrap();
        let mut pins = ChainPins::new(10, Duration::from_secs(60));
        let before = t(1);
        let c = pins.route_chain("k", &names, &[1.0, 0.0], before.as_ref(), Instant::ZERO);
        assert_eq!(c, vec![0, 1]);
        // a set to weight 0: the pin is not reused, a goes to the tail.
        let after = t(0);
        let c = pins.route_chain(
            "k",
            &names,
            &[0.0, 1.0],
            after.as_ref(),
            Instant::from_millis(1),
        );
        assert_eq!(c, vec![1, 0]);
    }
}
