//! The waiting room: work that found no room in its buckets waits here, per workload class,
//! shared fairly across tenants (DESIGN §4.7; seed 001, "design queues around workload
//! contracts").
//!
//! **Classes** are served in strict priority order (by default `interactive`, then
//! `production`, then `batch`; the order is the configuration's): a lower class gets capacity
//! only when no entry of a higher class can be admitted. Strict priority can starve a lower
//! class under sustained load from a higher one; that is the contract (interactive work has
//! short deadlines and small queues, so it cannot pile up for long), and deadlines bound how
//! long anything waits.
//!
//! **Within a class**, tenants share by deficit round robin (M. Shreedhar and G. Varghese,
//! "Efficient fair queuing using deficit round robin", SIGCOMM 1995). Each backlogged tenant
//! is visited in turn; on its turn its deficit grows by `quantum × weight`, and it is served
//! head-first while the head's cost fits the deficit; the rest of the deficit carries to its
//! next turn, and a tenant whose queue empties leaves the round with its deficit reset to 0.
//! Over any backlogged period tenant `i` receives a share `wᵢ / Σw` of the served cost, within
//! one maximum entry cost plus one quantum per round. Cost is whatever the caller measures
//! capacity in: the entry's input + output token estimate, or 1 per request. O(1) per served
//! entry when `quantum ≥` the largest cost; rounds in which nobody could be served are
//! fast-forwarded in one step, so a small quantum costs no extra loops.
//!
//! **Admission** is the caller's predicate: [`WaitingRoom::pop_ready`] offers heads in DRR
//! order to `can_admit` (normally "does [`crate::quota::Ledger::reserve`] succeed?") and returns
//! the first it accepts. A tenant whose head cannot be admitted right now (its own quota is
//! full) keeps its turn and its deficit, and the next tenants are tried, so one tenant's empty
//! bucket does not idle capacity that others could use. Call it whenever capacity may have
//! freed (a reconcile, a release, a refill deadline) until it returns `None`.
//!
//! **Bounds**: every entry has a deadline ([`WaitingRoom::expire`] returns overdue entries,
//! reason `queue_deadline`; `pop_ready` never hands one out); each class has a maximum depth per
//! tenant and in total, and an overload action: [`OverloadAction::Reject`] refuses the new entry
//! at once (`queue_full`), [`OverloadAction::ShedOldest`] admits it and evicts the oldest entry
//! (of the same tenant when the tenant is at its limit, else of the longest tenant queue).
//!
//! Alternatives rejected: weighted fair queuing by virtual finish times (WFQ/WF²Q) is fairer at
//! small time scales but needs a sorted structure and per-entry timestamps, O(log n) per
//! operation; first-come-first-served lets the first tenant to burst take the shared pool;
//! hard per-tenant partitions idle capacity while a tenant is quiet.

use std::collections::{HashMap, VecDeque};

use crate::time::Instant;

/// What to do when a push finds the queue full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverloadAction {
    /// Refuse the new entry at once (`queue_full`).
    Reject,
    /// Accept the new entry and evict the oldest one (returned so the caller answers it with
    /// `queue_full`).
    ShedOldest,
}

/// One workload class's queue settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassConfig {
    /// Class name, e.g. `interactive`.
    pub name: String,
    /// DRR quantum in cost units per unit of weight per turn (0 is taken as 1). Choose it at
    /// least the typical entry cost so a turn usually serves one entry or more.
    pub quantum: u64,
    /// Maximum entries one tenant may have waiting in this class.
    pub max_depth_per_tenant: usize,
    /// Maximum entries waiting in this class across tenants.
    pub max_depth_total: usize,
    /// What a push does when either maximum is reached.
    pub overload: OverloadAction,
}

impl ClassConfig {
    /// The default classes in priority order: `interactive` (16 per tenant, 256 total,
    /// reject), `production` (256, 4,096, reject) and `batch` (4,096, 65,536, shed oldest),
    /// each with a quantum of 4,096 (a typical request's tokens).
    pub fn defaults() -> Vec<ClassConfig> {
        let class = |name: &str, per_tenant, total, overload| ClassConfig {
            name: name.to_owned(),
            quantum: 4_096,
            max_depth_per_tenant: per_tenant,
            max_depth_total: total,
            overload,
        };
        vec![
            class("interactive", 16, 256, OverloadAction::Reject),
            class("production", 256, 4_096, OverloadAction::Reject),
            class("batch", 4_096, 65_536, OverloadAction::ShedOldest),
        ]
    }
}

/// A request waiting for capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<T> {
    /// Workload class name (must be configured).
    pub class: String,
    /// Tenant name (the DRR flow).
    pub tenant: String,
    /// The tenant's fair-share weight (0 is taken as 1); the latest push sets it.
    pub weight: u32,
    /// Cost in the class's capacity unit (token estimate, or 1).
    pub cost: u64,
    /// Give up at this instant (`queue_deadline`).
    pub deadline: Instant,
    /// The caller's data (e.g. the request and a channel to wake it).
    pub payload: T,
}

/// Identifies a waiting entry (unique for the life of the waiting room).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(u64);

impl EntryId {
    /// The id as a number, for logs.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

/// An entry as the waiting room holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued<T> {
    /// Its id.
    pub id: EntryId,
    /// When it was pushed (for queue-wait metrics).
    pub enqueued_at: Instant,
    /// The entry.
    pub entry: Entry<T>,
}

/// Why an entry left the queue without being admitted, as a reason code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueReason {
    /// The queue is full (rejected on push, or shed).
    QueueFull,
    /// The deadline passed (on push, or while waiting).
    QueueDeadline,
    /// The entry named a class that is not configured.
    UnknownClass,
}

impl QueueReason {
    /// `queue_full`, `queue_deadline` or `unknown_class`.
    pub const fn code(self) -> &'static str {
        match self {
            QueueReason::QueueFull => "queue_full",
            QueueReason::QueueDeadline => "queue_deadline",
            QueueReason::UnknownClass => "unknown_class",
        }
    }
}

/// A refused push: the reason and the entry, handed back so the caller can answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRefusal<T> {
    /// Why.
    pub reason: QueueReason,
    /// The entry that was not queued.
    pub entry: Entry<T>,
}

/// A successful push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed<T> {
    /// The new entry's id.
    pub id: EntryId,
    /// An entry evicted to make room ([`OverloadAction::ShedOldest`]); answer it `queue_full`.
    pub shed: Option<Queued<T>>,
}

#[derive(Debug, Clone)]
struct TenantQueue<T> {
    weight: u64,
    deficit: u64,
    /// Whether the current turn's quantum was already added.
    granted: bool,
    active: bool,
    entries: VecDeque<Queued<T>>,
}

#[derive(Debug, Clone)]
struct ClassQueue<T> {
    cfg: ClassConfig,
    tenants: Vec<TenantQueue<T>>,
    by_name: HashMap<String, usize>,
    /// Backlogged tenants in round order.
    active: Vec<usize>,
    /// Position in `active` whose turn it is.
    cursor: usize,
    depth: usize,
}

/// What a turn visit found.
enum Visit<T> {
    Served(Queued<T>),
    Blocked,
    /// Not enough deficit: rounds (beyond this one) until the head fits.
    Short(u64),
    Emptied,
}

impl<T> ClassQueue<T> {
    fn quantum(&self) -> u64 {
        self.cfg.quantum.max(1)
    }

    fn deactivate(&mut self, tenant: usize) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.active = false;
            t.deficit = 0;
            t.granted = false;
        }
        if let Some(pos) = self.active.iter().position(|&x| x == tenant) {
            self.active.remove(pos);
            if pos < self.cursor {
                self.cursor -= 1;
            } else if pos == self.cursor {
                self.move_cursor(pos);
            }
        }
        if self.cursor >= self.active.len() {
            self.cursor = 0;
        }
    }

    /// Hands the turn to the tenant at `pos` (wrapping). A quantum it was granted while being
    /// probed past a blocked turn holder belonged to that borrowed turn, not to its own: its
    /// own turn starts with a fresh quantum (its leftover deficit is kept, as DRR does).
    fn move_cursor(&mut self, pos: usize) {
        self.cursor = if pos >= self.active.len() { 0 } else { pos };
        if let Some(t) = self
            .active
            .get(self.cursor)
            .and_then(|&ti| self.tenants.get_mut(ti))
        {
            t.granted = false;
        }
    }

    /// Visits the tenant at `pos` in `active`.
    fn visit(
        &mut self,
        pos: usize,
        now: Instant,
        can_admit: &mut impl FnMut(&Entry<T>) -> bool,
        overdue: &mut Vec<Queued<T>>,
    ) -> Visit<T> {
        let quantum = self.quantum();
        let Some(&ti) = self.active.get(pos) else {
            return Visit::Blocked;
        };
        let Some(t) = self.tenants.get_mut(ti) else {
            return Visit::Blocked;
        };
        // Overdue heads never go out; park them for `expire`.
        while t.entries.front().is_some_and(|q| q.entry.deadline <= now) {
            if let Some(q) = t.entries.pop_front() {
                self.depth = self.depth.saturating_sub(1);
                overdue.push(q);
            }
        }
        let Some(head) = t.entries.front() else {
            return Visit::Emptied;
        };
        let per_turn = quantum.saturating_mul(t.weight);
        if !t.granted {
            t.deficit = t.deficit.saturating_add(per_turn);
            t.granted = true;
        }
        if head.entry.cost > t.deficit {
            // The turn ends; the leftover deficit carries to the next one.
            t.granted = false;
            let missing = head.entry.cost - t.deficit;
            return Visit::Short(missing.div_ceil(per_turn.max(1)));
        }
        if !can_admit(&head.entry) {
            return Visit::Blocked;
        }
        let Some(q) = t.entries.pop_front() else {
            return Visit::Emptied;
        };
        t.deficit -= q.entry.cost;
        self.depth = self.depth.saturating_sub(1);
        if t.entries.is_empty() {
            self.deactivate(ti);
        }
        Visit::Served(q)
    }

    fn pop(
        &mut self,
        now: Instant,
        can_admit: &mut impl FnMut(&Entry<T>) -> bool,
        overdue: &mut Vec<Queued<T>>,
    ) -> Option<Queued<T>> {
        // Pass 1 finds who can be served; if nobody fits their deficit, one fast-forward of the
        // empty rounds makes pass 2 serve (unless everyone left is blocked).
        for _pass in 0..3 {
            if self.active.is_empty() {
                return None;
            }
            if self.cursor >= self.active.len() {
                self.cursor = 0;
            }
            let mut shortest: Option<u64> = None;
            let mut short_tenants: Vec<usize> = Vec::new();
            let mut pos = self.cursor;
            // Each backlogged tenant is visited once per pass.
            let mut unvisited = self.active.len();
            let mut turn_holder = true;
            while unvisited > 0 && !self.active.is_empty() {
                if pos >= self.active.len() {
                    pos = 0;
                }
                let ti = self.active.get(pos).copied();
                match self.visit(pos, now, can_admit, overdue) {
                    Visit::Served(q) => return Some(q),
                    Visit::Emptied => {
                        if let Some(ti) = ti {
                            self.deactivate(ti);
                        }
                        // The next tenant slid into `pos`; the cursor followed if needed.
                        unvisited -= 1;
                        continue;
                    }
                    Visit::Blocked => {
                        turn_holder = false;
                        pos += 1;
                    }
                    Visit::Short(rounds) => {
                        if turn_holder {
                            self.move_cursor(pos + 1);
                        }
                        shortest = Some(shortest.map_or(rounds, |s| s.min(rounds)));
                        if let Some(ti) = ti {
                            short_tenants.push(ti);
                        }
                        pos += 1;
                    }
                }
                unvisited -= 1;
            }
            let shortest = shortest?;
            // Every short tenant would get `shortest − 1` more quanta in rounds where nobody is
            // served; grant them at once.
            let skip = shortest.saturating_sub(1);
            let quantum = self.quantum();
            for ti in short_tenants {
                if let Some(t) = self.tenants.get_mut(ti) {
                    t.deficit = t
                        .deficit
                        .saturating_add(skip.saturating_mul(quantum.saturating_mul(t.weight)));
                }
            }
        }
        None
    }
}

/// Waiting room of all workload classes. `T` is the caller's payload.
#[derive(Debug, Clone)]
pub struct WaitingRoom<T> {
    classes: Vec<ClassQueue<T>>,
    /// Where each waiting entry is: (class, tenant).
    index: HashMap<EntryId, (usize, usize)>,
    /// Overdue entries found by `pop_ready`, handed out by the next `expire`.
    overdue: Vec<Queued<T>>,
    next_id: u64,
}

impl<T> WaitingRoom<T> {
    /// A waiting room with `classes` in priority order (first = served first).
    pub fn new(classes: Vec<ClassConfig>) -> Self {
        WaitingRoom {
            classes: classes
                .into_iter()
                .map(|cfg| ClassQueue {
                    cfg,
                    tenants: Vec::new(),
                    by_name: HashMap::new(),
                    active: Vec::new(),
                    cursor: 0,
                    depth: 0,
                })
                .collect(),
            index: HashMap::new(),
            overdue: Vec::new(),
            next_id: 0,
        }
    }

    /// Entries waiting (overdue ones not yet returned by [`WaitingRoom::expire`] excluded).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Entries waiting in `class` (0 for an unknown class).
    pub fn class_depth(&self, class: &str) -> usize {
        self.classes
            .iter()
            .find(|c| c.cfg.name == class)
            .map_or(0, |c| c.depth)
    }

    /// Entries `tenant` has waiting in `class`.
    pub fn tenant_depth(&self, class: &str, tenant: &str) -> usize {
        self.classes
            .iter()
            .find(|c| c.cfg.name == class)
            .and_then(|c| c.by_name.get(tenant).and_then(|&i| c.tenants.get(i)))
            .map_or(0, |t| t.entries.len())
    }

    /// The earliest deadline among waiting entries (when to call [`WaitingRoom::expire`]).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.classes
            .iter()
            .flat_map(|c| c.tenants.iter())
            .flat_map(|t| t.entries.iter())
            .map(|q| q.entry.deadline)
            .min()
    }

    /// Queues `entry` at `now`.
    ///
    /// Errors (the entry is handed back): [`QueueReason::UnknownClass`];
    /// [`QueueReason::QueueDeadline`] when `deadline ≤ now`; [`QueueReason::QueueFull`] when a
    /// depth limit is reached and the class rejects. With [`OverloadAction::ShedOldest`] the
    /// push succeeds and [`Pushed::shed`] carries the evicted entry.
    pub fn push(&mut self, entry: Entry<T>, now: Instant) -> Result<Pushed<T>, QueueRefusal<T>> {
        let Some(ci) = self.classes.iter().position(|c| c.cfg.name == entry.class) else {
            return Err(QueueRefusal {
                reason: QueueReason::UnknownClass,
                entry,
            });
        };
        if entry.deadline <= now {
            return Err(QueueRefusal {
                reason: QueueReason::QueueDeadline,
                entry,
            });
        }
        let Some(class) = self.classes.get_mut(ci) else {
            return Err(QueueRefusal {
                reason: QueueReason::UnknownClass,
                entry,
            });
        };
        let ti = match class.by_name.get(&entry.tenant) {
            Some(&ti) => ti,
            None => {
                let ti = class.tenants.len();
                class.by_name.insert(entry.tenant.clone(), ti);
                class.tenants.push(TenantQueue {
                    weight: 1,
                    deficit: 0,
                    granted: false,
                    active: false,
                    entries: VecDeque::new(),
                });
                ti
            }
        };
        let own = class.tenants.get(ti).map_or(0, |t| t.entries.len());
        let tenant_full = own >= class.cfg.max_depth_per_tenant;
        let total_full = class.depth >= class.cfg.max_depth_total;
        let mut shed = None;
        if tenant_full || total_full {
            let victim = match class.cfg.overload {
                OverloadAction::Reject => None,
                OverloadAction::ShedOldest if tenant_full => (own > 0).then_some(ti),
                OverloadAction::ShedOldest => class
                    .active
                    .iter()
                    .copied()
                    .max_by_key(|&i| class.tenants.get(i).map_or(0, |t| t.entries.len())),
            };
            let Some(victim) = victim else {
                return Err(QueueRefusal {
                    reason: QueueReason::QueueFull,
                    entry,
                });
            };
            if let Some(old) = class
                .tenants
                .get_mut(victim)
                .and_then(|t| t.entries.pop_front())
            {
                class.depth = class.depth.saturating_sub(1);
                self.index.remove(&old.id);
                shed = Some(old);
            }
            if class
                .tenants
                .get(victim)
                .is_some_and(|t| t.entries.is_empty())
                && victim != ti
            {
                class.deactivate(victim);
            }
        }
        let id = EntryId(self.next_id);
        self.next_id += 1;
        let Some(t) = class.tenants.get_mut(ti) else {
            return Err(QueueRefusal {
                reason: QueueReason::UnknownClass,
                entry,
            });
        };
        t.weight = u64::from(entry.weight.max(1));
        t.entries.push_back(Queued {
            id,
            enqueued_at: now,
            entry,
        });
        if !t.active {
            t.active = true;
            // A tenant joining the round waits for its turn at the end of it.
            class.active.push(ti);
        }
        class.depth += 1;
        self.index.insert(id, (ci, ti));
        Ok(Pushed { id, shed })
    }

    /// The next entry to admit at `now`, or `None`.
    ///
    /// Classes in priority order; within a class, heads in DRR order are offered to
    /// `can_admit` and the first it accepts is removed and returned (the caller then holds
    /// the reservation `can_admit` made). Overdue entries are never offered; they are kept for
    /// [`WaitingRoom::expire`].
    pub fn pop_ready(
        &mut self,
        now: Instant,
        mut can_admit: impl FnMut(&Entry<T>) -> bool,
    ) -> Option<Queued<T>> {
        for class in &mut self.classes {
            let before = self.overdue.len();
            let served = class.pop(now, &mut can_admit, &mut self.overdue);
            for q in self.overdue.get(before..).unwrap_or(&[]) {
                self.index.remove(&q.id);
            }
            if let Some(q) = served {
                self.index.remove(&q.id);
                return Some(q);
            }
        }
        None
    }

    /// Removes and returns every entry whose deadline is ≤ `now` (answer them
    /// `queue_deadline`). O(waiting entries).
    pub fn expire(&mut self, now: Instant) -> Vec<Queued<T>> {
        let mut out = std::mem::take(&mut self.overdue);
        for class in &mut self.classes {
            let mut emptied = Vec::new();
            for (ti, t) in class.tenants.iter_mut().enumerate() {
                if !t.entries.iter().any(|q| q.entry.deadline <= now) {
                    continue;
                }
                let (gone, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut t.entries)
                    .into_iter()
                    .partition(|q| q.entry.deadline <= now);
                t.entries = kept;
                class.depth = class.depth.saturating_sub(gone.len());
                for q in gone {
                    self.index.remove(&q.id);
                    out.push(q);
                }
                if t.entries.is_empty() && t.active {
                    emptied.push(ti);
                }
            }
            for ti in emptied {
                class.deactivate(ti);
            }
        }
        out
    }

    /// Removes a waiting entry (its client went away). `None` if it is no longer waiting.
    pub fn remove(&mut self, id: EntryId) -> Option<Queued<T>> {
        let (ci, ti) = self.index.remove(&id)?;
        let class = self.classes.get_mut(ci)?;
        let t = class.tenants.get_mut(ti)?;
        let pos = t.entries.iter().position(|q| q.id == id)?;
        let q = t.entries.remove(pos)?;
        class.depth = class.depth.saturating_sub(1);
        if t.entries.is_empty() {
            class.deactivate(ti);
        }
        Some(q)
    }
}
