//! FIFO wait lines in front of full providers (issue 18, item 1: outages without client errors).
//!
//! When a provider is full (a capacity refusal paused its scope, [`crate::pause`]), the
//! requests that have nowhere else to go wait for room until their deadline. Without lines,
//! every waiter sleeps to its own timer (the pause end) and re-contends: at the end of each
//! pause the whole crowd stampedes, a few win, the rest meet the next 429 and sleep again, and
//! which request wins is luck. Some lose every round and miss their deadline while later
//! arrivals are served: in `primary-outage` that unfairness was most of the client errors.
//!
//! [`WaitLines`] keeps one line per provider pause scope (the provider's own scope, the first
//! of its pause scopes: the key the pause table uses for "this provider is full"):
//! - **Ticket**: a waiter's place is the time it first waited on any line (a virtual or
//!   monotonic [`Instant`]), ties broken by a sequence number: `(first_wait, seq)`. The ticket
//!   is kept until the waiter leaves for good, so a request that reaches the head, is sent and
//!   meets another 429 goes back to the front, not the back.
//! - **Head only**: only the line's head may try the full provider, and only while fewer than
//!   `window` attempts sent from the line are in flight (default [`DEFAULT_WINDOW`] = 64
//!   attempts). A request that is not head skips the provider and waits to be woken.
//!   Requests that have never waited are not held back by a line: they pass a provider whose
//!   pause is over and never touch the lines (the router's hot path takes no lock for them).
//! - **Too late**: a head whose remaining time is below the line's recent service time (a
//!   moving average, weight 0.1, of how long served attempts from the line took, in seconds
//!   of the driver's clock) is not sent: it leaves that line ([`WaitLines::doomed`]). When the
//!   wait exceeds the deadline, a FIFO sends exactly the requests with the least time left;
//!   sent, they debit the provider's buckets and run into their deadline, spending the scarce
//!   room on answers nobody receives (measured in the simulator: a collapse to 64 % errors).
//! - **Early wake**: when the head's attempt is sent or the head leaves (served elsewhere,
//!   deadline, client gone), or a window slot comes back, the new head is woken at once
//!   ([`WaitLines::take_woken`]) instead of sleeping to its own timer. The driver delivers it:
//!   the simulator as a virtual-time event, the router through a `tokio::sync::Notify`.
//! - **Cost**: lines are `BTreeMap`s keyed by ticket, so join, leave and the head lookup are
//!   O(log n) in the line's length; waiters are found by id in a hash map. Memory: one entry
//!   per waiter per line it waits in, plus one per line; an empty line with nothing in flight
//!   is dropped.
//!
//! Why FIFO: a shared pause turns the waiters into a queue served at the provider's rate. By
//! Little's law the mean wait is the same for any order that serves the same number of
//! requests, so the order only decides who bears the wait; FIFO (like a ticket lock instead
//! of a test-and-set spin lock) bounds the longest one by the line's length over the service
//! rate, which is what a deadline cares about. Tails, not means, are what users of a
//! fan-out service notice (Dean and Barroso, "The Tail at Scale", CACM 2013).
//!
//! Alternatives rejected:
//! - *Independent timers with jitter*: spreads the stampede over the jitter but keeps the
//!   lottery; the oldest waiter is no likelier to win than the newest, so deadline misses
//!   remain (measured: lines off in docs/simulation.md).
//! - *LIFO / adaptive LIFO (CoDel-style, as in Facebook's queue handling)*: serving the newest
//!   first gives a better median under overload, because fresh requests are still wanted,
//!   but it deliberately starves the oldest, and here every waiter is still wanted until its
//!   own deadline: LIFO maximises exactly the deadline misses this is meant to remove.

use std::collections::{BTreeMap, HashMap};

use std::time::Duration;

use crate::time::Instant;

/// A waiter's identity, chosen by the driver (unique among live waiters).
pub type WaiterId = u64;

/// Attempts sent from one line that may be in flight at once.
pub const DEFAULT_WINDOW: usize = 64;

type Ticket = (Instant, u64);

#[derive(Debug, Default)]
struct Line {
    queue: BTreeMap<Ticket, WaiterId>,
    in_flight: usize,
}

#[derive(Debug)]
struct Waiter {
    ticket: Ticket,
    /// Lines it waits in (few: the providers of one route).
    lines: Vec<String>,
    /// The line whose window slot its attempt in flight holds, and when it was sent.
    slot: Option<(String, Instant)>,
}

/// The wait lines of a fleet (module docs).
#[derive(Debug)]
pub struct WaitLines {
    window: usize,
    lines: HashMap<String, Line>,
    waiters: HashMap<WaiterId, Waiter>,
    seq: u64,
    woken: Vec<WaiterId>,
    queued: usize,
    /// Per scope: the moving average of how long a served attempt from its line took.
    service: HashMap<String, Duration>,
}

/// Weight of a new sample in the service-time average (about the last 10 attempts).
const SERVICE_ALPHA: f64 = 0.1;

impl Default for WaitLines {
    fn default() -> Self {
        WaitLines::new(DEFAULT_WINDOW)
    }
}

impl WaitLines {
    /// No lines; at most `window` attempts from one line in flight (at least 1).
    pub fn new(window: usize) -> Self {
        WaitLines {
            window: window.max(1),
            lines: HashMap::new(),
            waiters: HashMap::new(),
            seq: 0,
            woken: Vec::new(),
            queued: 0,
            service: HashMap::new(),
        }
    }

    /// Joins `scope`'s line at `now` (idempotent). The ticket is the time of the waiter's
    /// first join of any line since it last left.
    pub fn join(&mut self, scope: &str, id: WaiterId, now: Instant) {
        let seq = &mut self.seq;
        let w = self.waiters.entry(id).or_insert_with(|| {
            *seq += 1;
            Waiter {
                ticket: (now, *seq),
                lines: Vec::new(),
                slot: None,
            }
        });
        if w.lines.iter().any(|l| l == scope) {
            return;
        }
        w.lines.push(scope.to_owned());
        let ticket = w.ticket;
        self.lines
            .entry(scope.to_owned())
            .or_default()
            .queue
            .insert(ticket, id);
        self.queued += 1;
    }

    /// Whether anybody waits in `scope`'s line.
    pub fn is_waiting(&self, scope: &str) -> bool {
        self.lines.get(scope).is_some_and(|l| !l.queue.is_empty())
    }

    /// Whether `id` may try `scope`'s provider now: the line is empty, or `id` is its head and
    /// the window has room.
    pub fn may_try(&self, scope: &str, id: WaiterId) -> bool {
        let Some(line) = self.lines.get(scope) else {
            return true;
        };
        match line.queue.first_key_value() {
            None => true,
            Some((_, &head)) => head == id && line.in_flight < self.window,
        }
    }

    /// Whether `id` is at the head of `scope`'s line (window aside).
    pub fn is_head(&self, scope: &str, id: WaiterId) -> bool {
        self.lines
            .get(scope)
            .and_then(|l| l.queue.first_key_value())
            .is_some_and(|(_, &h)| h == id)
    }

    /// How long a served attempt from `scope`'s line has taken lately (a moving average over
    /// about the last 10), if one was served.
    pub fn service_time(&self, scope: &str) -> Option<Duration> {
        self.service.get(scope).copied()
    }

    /// Whether `id` may try `scope` but cannot expect an answer within `remaining`: it is the
    /// head, the window has room, and `remaining` is below the line's service time. Sending it
    /// would spend the provider's scarce room on an attempt that ends at its deadline; it
    /// should leave the line ([`WaitLines::leave_line`]) so the next waiter gets the turn.
    pub fn doomed(&self, scope: &str, id: WaiterId, remaining: Duration) -> bool {
        self.may_try(scope, id) && self.service_time(scope).is_some_and(|s| remaining < s)
    }

    /// `id` leaves `scope`'s line only (it keeps its ticket and other places).
    pub fn leave_line(&mut self, scope: &str, id: WaiterId) {
        let Some(w) = self.waiters.get_mut(&id) else {
            return;
        };
        let before = w.lines.len();
        w.lines.retain(|l| l != scope);
        if w.lines.len() < before {
            let ticket = w.ticket;
            self.remove(scope, ticket);
        }
    }

    /// `id` sent an attempt to `scope`'s provider at `now`: it leaves every line (keeping its
    /// ticket, in case it must wait again); the attempt takes a window slot of `scope`'s line
    /// when `id` waited in it. New heads are woken. Returns whether a slot was taken.
    pub fn sent(&mut self, id: WaiterId, scope: &str, now: Instant) -> bool {
        let Some(w) = self.waiters.get_mut(&id) else {
            return false;
        };
        let lines = std::mem::take(&mut w.lines);
        let ticket = w.ticket;
        let slot = lines.iter().any(|l| l == scope);
        if slot {
            w.slot = Some((scope.to_owned(), now));
            if let Some(line) = self.lines.get_mut(scope) {
                line.in_flight += 1;
            }
        }
        for l in &lines {
            self.remove(l, ticket);
        }
        slot
    }

    /// The attempt `id` sent ended at `now` (`served`: with an answer): its window slot (if
    /// any) comes back and that line's head is woken; a served attempt updates the line's
    /// service time.
    pub fn attempt_done(&mut self, id: WaiterId, now: Instant, served: bool) {
        let Some((scope, sent)) = self.waiters.get_mut(&id).and_then(|w| w.slot.take()) else {
            return;
        };
        if served {
            let took = now.saturating_since(sent);
            let avg = self.service.entry(scope.clone()).or_insert(took);
            *avg = avg.mul_f64(1.0 - SERVICE_ALPHA) + took.mul_f64(SERVICE_ALPHA);
        }
        if let Some(line) = self.lines.get_mut(&scope) {
            line.in_flight = line.in_flight.saturating_sub(1);
        }
        self.wake_head(&scope);
        self.drop_if_idle(&scope);
    }

    /// `id` is done (served, failed, deadline, client gone): it leaves every line, gives back
    /// its slot and forgets its ticket. Idempotent.
    pub fn leave(&mut self, id: WaiterId) {
        if let Some(w) = self.waiters.get_mut(&id)
            && let Some((scope, _)) = w.slot.take()
        {
            if let Some(line) = self.lines.get_mut(&scope) {
                line.in_flight = line.in_flight.saturating_sub(1);
            }
            self.wake_head(&scope);
            self.drop_if_idle(&scope);
        }
        let Some(w) = self.waiters.remove(&id) else {
            return;
        };
        for l in &w.lines {
            self.remove(l, w.ticket);
        }
    }

    /// The waiters woken since the last call, in waking order (a waiter may appear twice).
    pub fn take_woken(&mut self) -> Vec<WaiterId> {
        std::mem::take(&mut self.woken)
    }

    /// Whether a wake-up is pending for [`WaitLines::take_woken`].
    pub fn has_woken(&self) -> bool {
        !self.woken.is_empty()
    }

    /// Per line: its scope, waiters, attempts in flight and head (for metrics and tests).
    pub fn stats(&self) -> impl Iterator<Item = (&str, usize, usize, Option<WaiterId>)> + '_ {
        self.lines.iter().map(|(scope, l)| {
            (
                scope.as_str(),
                l.queue.len(),
                l.in_flight,
                l.queue.first_key_value().map(|(_, &h)| h),
            )
        })
    }

    /// Waiter places over all lines.
    pub fn len(&self) -> usize {
        self.queued
    }

    /// Whether no line has a waiter.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Takes `ticket` out of `scope`'s line; wakes the new head if it was the head.
    fn remove(&mut self, scope: &str, ticket: Ticket) {
        let Some(line) = self.lines.get_mut(scope) else {
            return;
        };
        let was_head = line.queue.first_key_value().map(|(t, _)| *t) == Some(ticket);
        if line.queue.remove(&ticket).is_some() {
            self.queued -= 1;
        }
        if was_head {
            self.wake_head(scope);
        }
        self.drop_if_idle(scope);
    }

    fn wake_head(&mut self, scope: &str) {
        if let Some(line) = self.lines.get(scope)
            && line.in_flight < self.window
            && let Some((_, &head)) = line.queue.first_key_value()
        {
            self.woken.push(head);
        }
    }

    fn drop_if_idle(&mut self, scope: &str) {
        if self
            .lines
            .get(scope)
            .is_some_and(|l| l.queue.is_empty() && l.in_flight == 0)
        {
            self.lines.remove(scope);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn t(s: u64) -> Instant {
        Instant::from_origin(Duration::from_secs(s))
    }

    #[test]
    fn order_is_first_wait_then_sequence() {
        let mut l = WaitLines::new(4);
        l.join("a", 3, t(5));
        l.join("a", 1, t(7));
        l.join("a", 2, t(5));
        // 3 and 2 joined at 5 s: 3 first (sequence); 1 joined later.
        assert!(l.is_head("a", 3));
        assert!(l.may_try("a", 3));
        assert!(!l.may_try("a", 2));
        l.sent(3, "a", t(8));
        assert!(l.is_head("a", 2));
        l.sent(2, "a", t(8));
        assert!(l.is_head("a", 1));
        assert_eq!(l.take_woken(), vec![2, 1]);
    }

    #[test]
    fn only_the_head_may_try_and_an_empty_line_admits_anyone() {
        let mut l = WaitLines::new(4);
        assert!(l.may_try("a", 9));
        l.join("a", 1, t(1));
        l.join("a", 2, t(2));
        assert!(l.may_try("a", 1));
        assert!(!l.may_try("a", 2));
        // A request not in the line must not jump it.
        assert!(!l.may_try("a", 9));
        // Other lines are independent.
        assert!(l.may_try("b", 2));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn the_window_bounds_attempts_in_flight() {
        let mut l = WaitLines::new(2);
        for id in 1..=4 {
            l.join("a", id, t(id));
        }
        assert!(l.sent(1, "a", t(8)));
        assert!(l.sent(2, "a", t(8)));
        // Two in flight: the head (3) waits for a slot and is not woken by 2's send.
        assert!(l.is_head("a", 3));
        assert!(!l.may_try("a", 3));
        assert_eq!(l.take_woken(), vec![2]);
        l.attempt_done(1, t(9), false);
        assert!(l.may_try("a", 3));
        assert_eq!(l.take_woken(), vec![3]);
    }

    #[test]
    fn a_sent_waiter_keeps_its_ticket_and_returns_to_the_front() {
        let mut l = WaitLines::new(8);
        l.join("a", 1, t(1));
        l.join("a", 2, t(2));
        l.sent(1, "a", t(8));
        l.attempt_done(1, t(9), false);
        // 1 met another 429: it waits again with its first ticket, ahead of 2.
        l.join("a", 1, t(30));
        assert!(l.is_head("a", 1));
        assert!(!l.may_try("a", 2));
    }

    #[test]
    fn leaving_removes_the_waiter_everywhere_and_wakes_new_heads() {
        let mut l = WaitLines::new(8);
        l.join("a", 1, t(1));
        l.join("b", 1, t(1));
        l.join("a", 2, t(2));
        l.join("b", 3, t(3));
        l.leave(1);
        assert!(l.is_head("a", 2));
        assert!(l.is_head("b", 3));
        let mut woken = l.take_woken();
        woken.sort_unstable();
        assert_eq!(woken, vec![2, 3]);
        l.leave(2);
        l.leave(3);
        l.leave(3);
        assert!(l.is_empty());
        assert!(l.lines.is_empty(), "idle lines are dropped");
        assert!(l.waiters.is_empty());
    }

    #[test]
    fn a_head_without_the_time_for_an_answer_is_doomed() {
        let mut l = WaitLines::new(8);
        l.join("a", 1, t(1));
        l.join("a", 2, t(2));
        // No service time known yet: nobody is doomed.
        assert!(!l.doomed("a", 1, Duration::from_secs(1)));
        l.sent(1, "a", t(10));
        l.attempt_done(1, t(20), true);
        assert_eq!(l.service_time("a"), Some(Duration::from_secs(10)));
        assert!(l.doomed("a", 2, Duration::from_secs(5)));
        assert!(!l.doomed("a", 2, Duration::from_secs(15)));
        l.join("a", 3, t(3));
        l.take_woken();
        l.leave_line("a", 2);
        assert!(l.is_head("a", 3));
        assert_eq!(l.take_woken(), vec![3]);
    }

    #[test]
    fn a_non_head_leaving_wakes_nobody() {
        let mut l = WaitLines::new(8);
        l.join("a", 1, t(1));
        l.join("a", 2, t(2));
        l.leave(2);
        assert!(l.take_woken().is_empty());
        assert!(l.is_head("a", 1));
    }

    #[test]
    fn leaving_with_an_attempt_in_flight_gives_its_slot_back() {
        let mut l = WaitLines::new(1);
        l.join("a", 1, t(1));
        l.join("a", 2, t(2));
        l.sent(1, "a", t(8));
        assert!(!l.may_try("a", 2));
        l.take_woken();
        // The client of 1 went away mid-attempt.
        l.leave(1);
        assert!(l.may_try("a", 2));
        assert_eq!(l.take_woken(), vec![2]);
    }
}
