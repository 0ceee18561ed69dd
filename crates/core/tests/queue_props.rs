//! The waiting room (DESIGN §4.7): DRR fairness by weight, deadlines, depth limits and overload
//! actions, class priority, and conservation of entries under any interleaving.

// Test helpers outside #[test] functions unwrap too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use switchyard_core::queue::{
    ClassConfig, Entry, EntryId, OverloadAction, QueueReason, WaitingRoom,
};
use switchyard_core::time::Instant;

fn class(
    name: &str,
    quantum: u64,
    per_tenant: usize,
    total: usize,
    overload: OverloadAction,
) -> ClassConfig {
    ClassConfig {
        name: name.to_owned(),
        quantum,
        max_depth_per_tenant: per_tenant,
        max_depth_total: total,
        overload,
    }
}

fn entry(
    class: &str,
    tenant: &str,
    weight: u32,
    cost: u64,
    deadline_ms: u64,
    payload: u32,
) -> Entry<u32> {
    Entry {
        class: class.to_owned(),
        tenant: tenant.to_owned(),
        weight,
        cost,
        deadline: Instant::from_millis(deadline_ms),
        payload,
    }
}

const LATE: u64 = 3_600_000;

/// Two tenants with weights 3:1 keep the class saturated; returns their served cost shares.
fn served_shares(quantum: u64, cost: impl Fn(&mut ChaCha8Rng) -> u64, pops: usize) -> (f64, f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut room = WaitingRoom::new(vec![class(
        "production",
        quantum,
        100,
        1_000,
        OverloadAction::Reject,
    )]);
    let now = Instant::ZERO;
    for _ in 0..50 {
        room.push(
            entry("production", "heavy", 3, cost(&mut rng), LATE, 0),
            now,
        )
        .unwrap();
        room.push(
            entry("production", "light", 1, cost(&mut rng), LATE, 1),
            now,
        )
        .unwrap();
    }
    let mut served: HashMap<String, u64> = HashMap::new();
    for _ in 0..pops {
        let q = room.pop_ready(now, |_| true).unwrap();
        *served.entry(q.entry.tenant.clone()).or_default() += q.entry.cost;
        // Keep both backlogged: whoever was served queues another request.
        let w = if q.entry.tenant == "heavy" { 3 } else { 1 };
        room.push(
            entry("production", &q.entry.tenant, w, cost(&mut rng), LATE, 0),
            now,
        )
        .unwrap();
    }
    let heavy = served["heavy"] as f64;
    let light = served["light"] as f64;
    (heavy / (heavy + light), light / (heavy + light))
}

#[test]
fn drr_weights_three_to_one_unit_cost_serves_three_to_one() {
    let (heavy, light) = served_shares(1, |_| 1, 4_000);
    assert!((heavy - 0.75).abs() <= 0.075, "heavy share {heavy}");
    assert!((light - 0.25).abs() <= 0.025, "light share {light}");
}

#[test]
fn drr_weights_three_to_one_token_costs_serve_three_to_one_within_ten_percent() {
    // Costs are token estimates between 200 and 8,000; quantum 4,096 (below the largest cost).
    let (heavy, light) = served_shares(4_096, |rng| rng.random_range(200..8_000), 4_000);
    assert!(
        (heavy / light - 3.0).abs() <= 0.3,
        "ratio {}",
        heavy / light
    );
}

#[test]
fn drr_small_quantum_large_costs_still_fair_and_terminates() {
    let (heavy, light) = served_shares(1, |rng| rng.random_range(10_000..20_000), 2_000);
    assert!(
        (heavy / light - 3.0).abs() <= 0.3,
        "ratio {}",
        heavy / light
    );
}

#[test]
fn queue_deadline_expiry_returns_overdue_entries_and_never_pops_them() {
    let mut room = WaitingRoom::new(ClassConfig::defaults());
    let now = Instant::ZERO;
    let a = room
        .push(entry("interactive", "t1", 1, 1, 1_000, 1), now)
        .unwrap()
        .id;
    let b = room
        .push(entry("interactive", "t1", 1, 1, 5_000, 2), now)
        .unwrap()
        .id;
    assert_eq!(room.next_deadline(), Some(Instant::from_millis(1_000)));
    assert!(room.expire(Instant::from_millis(999)).is_empty());
    // Nothing admissible before the deadline...
    assert!(
        room.pop_ready(Instant::from_millis(500), |_| false)
            .is_none()
    );
    // ...and at the deadline the head is overdue: pop skips it and serves the next.
    let q = room
        .pop_ready(Instant::from_millis(1_000), |_| true)
        .unwrap();
    assert_eq!(q.id, b);
    let gone = room.expire(Instant::from_millis(1_000));
    assert_eq!(gone.iter().map(|q| q.id).collect::<Vec<_>>(), vec![a]);
    assert_eq!(QueueReason::QueueDeadline.code(), "queue_deadline");
    assert!(room.is_empty());
    let late = room.push(
        entry("interactive", "t1", 1, 1, 10, 3),
        Instant::from_millis(10),
    );
    assert_eq!(late.unwrap_err().reason, QueueReason::QueueDeadline);
}

#[test]
fn full_queue_rejects_at_once_and_hands_the_entry_back() {
    let mut room = WaitingRoom::new(vec![class("interactive", 1, 2, 3, OverloadAction::Reject)]);
    let now = Instant::ZERO;
    room.push(entry("interactive", "t1", 1, 1, LATE, 1), now)
        .unwrap();
    room.push(entry("interactive", "t1", 1, 1, LATE, 2), now)
        .unwrap();
    let refused = room
        .push(entry("interactive", "t1", 1, 1, LATE, 3), now)
        .unwrap_err();
    assert_eq!(refused.reason, QueueReason::QueueFull);
    assert_eq!(refused.reason.code(), "queue_full");
    assert_eq!(refused.entry.payload, 3);
    // Another tenant still fits until the class total.
    room.push(entry("interactive", "t2", 1, 1, LATE, 4), now)
        .unwrap();
    let refused = room
        .push(entry("interactive", "t3", 1, 1, LATE, 5), now)
        .unwrap_err();
    assert_eq!(refused.reason, QueueReason::QueueFull);
    assert_eq!(room.len(), 3);
    let unknown = room
        .push(entry("nope", "t1", 1, 1, LATE, 6), now)
        .unwrap_err();
    assert_eq!(unknown.reason, QueueReason::UnknownClass);
}

#[test]
fn shed_oldest_evicts_own_oldest_or_the_longest_queue() {
    let mut room = WaitingRoom::new(vec![class("batch", 1, 2, 3, OverloadAction::ShedOldest)]);
    let now = Instant::ZERO;
    let first = room.push(entry("batch", "t1", 1, 1, LATE, 1), now).unwrap();
    assert!(first.shed.is_none());
    room.push(entry("batch", "t1", 1, 1, LATE, 2), now).unwrap();
    let pushed = room.push(entry("batch", "t1", 1, 1, LATE, 3), now).unwrap();
    assert_eq!(pushed.shed.unwrap().id, first.id);
    assert_eq!(room.tenant_depth("batch", "t1"), 2);
    room.push(entry("batch", "t2", 1, 1, LATE, 4), now).unwrap();
    // Class total reached by t3: the longest queue (t1) loses its oldest.
    let pushed = room.push(entry("batch", "t3", 1, 1, LATE, 5), now).unwrap();
    assert_eq!(pushed.shed.unwrap().entry.payload, 2);
    assert_eq!(room.class_depth("batch"), 3);
}

#[test]
fn class_priority_serves_interactive_before_production_before_batch() {
    let mut room = WaitingRoom::new(ClassConfig::defaults());
    let now = Instant::ZERO;
    room.push(entry("batch", "t1", 1, 1, LATE, 3), now).unwrap();
    room.push(entry("production", "t1", 1, 1, LATE, 2), now)
        .unwrap();
    room.push(entry("interactive", "t2", 1, 1, LATE, 1), now)
        .unwrap();
    let order: Vec<u32> = std::iter::from_fn(|| room.pop_ready(now, |_| true))
        .map(|q| q.entry.payload)
        .collect();
    assert_eq!(order, vec![1, 2, 3]);

    // A configured order wins.
    let mut room = WaitingRoom::new(vec![
        class("batch", 1, 8, 8, OverloadAction::Reject),
        class("interactive", 1, 8, 8, OverloadAction::Reject),
    ]);
    room.push(entry("interactive", "t1", 1, 1, LATE, 1), now)
        .unwrap();
    room.push(entry("batch", "t1", 1, 1, LATE, 2), now).unwrap();
    assert_eq!(room.pop_ready(now, |_| true).unwrap().entry.payload, 2);

    // A higher class that cannot be admitted does not block a lower one.
    let mut room = WaitingRoom::new(ClassConfig::defaults());
    room.push(entry("interactive", "t1", 1, 1, LATE, 1), now)
        .unwrap();
    room.push(entry("batch", "t2", 1, 1, LATE, 2), now).unwrap();
    let q = room.pop_ready(now, |e| e.tenant != "t1").unwrap();
    assert_eq!(q.entry.payload, 2);
}

#[test]
fn blocked_tenant_keeps_its_turn_while_others_use_the_capacity() {
    let mut room = WaitingRoom::new(vec![class(
        "production",
        1,
        100,
        100,
        OverloadAction::Reject,
    )]);
    let now = Instant::ZERO;
    for i in 0..5 {
        room.push(entry("production", "a", 1, 1, LATE, i), now)
            .unwrap();
        room.push(entry("production", "b", 1, 1, LATE, 10 + i), now)
            .unwrap();
    }
    // a's own quota is full: b is served meanwhile.
    for _ in 0..3 {
        let q = room.pop_ready(now, |e| e.tenant != "a").unwrap();
        assert_eq!(q.entry.tenant, "b");
    }
    // a's bucket refills: it is served first (it held the turn), then they alternate.
    let order: Vec<String> = (0..4)
        .map(|_| room.pop_ready(now, |_| true).unwrap().entry.tenant)
        .collect();
    assert_eq!(order, vec!["a", "b", "a", "b"]);
    assert!(room.pop_ready(now, |_| false).is_none());
}

#[test]
fn remove_takes_a_waiting_entry_out_once() {
    let mut room = WaitingRoom::new(ClassConfig::defaults());
    let id = room
        .push(entry("production", "t1", 1, 1, LATE, 1), Instant::ZERO)
        .unwrap()
        .id;
    assert_eq!(room.remove(id).unwrap().entry.payload, 1);
    assert!(room.remove(id).is_none());
    assert!(room.pop_ready(Instant::ZERO, |_| true).is_none());
}

#[derive(Debug, Clone)]
enum Op {
    Push {
        class: usize,
        tenant: usize,
        cost: u64,
        ttl_ms: u64,
    },
    Pop {
        admit_mask: u8,
    },
    Expire,
    Remove(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0usize..3, 0usize..4, 1u64..10_000, 1u64..5_000)
            .prop_map(|(class, tenant, cost, ttl_ms)| Op::Push { class, tenant, cost, ttl_ms }),
        4 => any::<u8>().prop_map(|admit_mask| Op::Pop { admit_mask }),
        1 => Just(Op::Expire),
        1 => any::<usize>().prop_map(Op::Remove),
        2 => (0u64..1_000).prop_map(Op::Advance),
    ]
}

proptest! {
    #[test]
    fn waiting_room_every_entry_leaves_exactly_once(
        ops in prop::collection::vec(op(), 1..400),
        quantum in 1u64..5_000,
        shed in any::<bool>(),
    ) {
        let overload = if shed { OverloadAction::ShedOldest } else { OverloadAction::Reject };
        let names = ["interactive", "production", "batch"];
        let mut room = WaitingRoom::new(
            names.iter().map(|n| class(n, quantum, 5, 12, overload)).collect(),
        );
        let mut now = Instant::ZERO;
        let mut waiting: HashSet<EntryId> = HashSet::new();
        let mut out: HashSet<EntryId> = HashSet::new();
        let mut ids: Vec<EntryId> = Vec::new();
        let leave = |id: EntryId, waiting: &mut HashSet<EntryId>, out: &mut HashSet<EntryId>| {
            prop_assert!(waiting.remove(&id), "{:?} left but was not waiting", id);
            prop_assert!(out.insert(id), "{:?} left twice", id);
            Ok(())
        };
        for op in ops {
            match op {
                Op::Push { class: c, tenant, cost, ttl_ms } => {
                    let e = entry(names[c], &format!("t{tenant}"), tenant as u32 + 1, cost, 0, 0);
                    let e = Entry { deadline: now + Duration::from_millis(ttl_ms), ..e };
                    if let Ok(p) = room.push(e, now) {
                        waiting.insert(p.id);
                        ids.push(p.id);
                        if let Some(s) = p.shed {
                            leave(s.id, &mut waiting, &mut out)?;
                        }
                    }
                    prop_assert!(room.class_depth(names[c]) <= 12);
                    let name = format!("t{}", tenant);
                    prop_assert!(room.tenant_depth(names[c], &name) <= 5);
                }
                Op::Pop { admit_mask } => {
                    let popped = room.pop_ready(now, |e| {
                        let t: usize = e.tenant[1..].parse().unwrap();
                        admit_mask & (1 << t) != 0
                    });
                    if let Some(q) = popped {
                        prop_assert!(q.entry.deadline > now);
                        let t: usize = q.entry.tenant[1..].parse().unwrap();
                        prop_assert!(admit_mask & (1 << t) != 0);
                        leave(q.id, &mut waiting, &mut out)?;
                    }
                }
                Op::Expire => {
                    for q in room.expire(now) {
                        prop_assert!(q.entry.deadline <= now);
                        leave(q.id, &mut waiting, &mut out)?;
                    }
                }
                Op::Remove(i) => {
                    if let Some(&id) = ids.get(i % ids.len().max(1))
                        && let Some(q) = room.remove(id)
                    {
                        leave(q.id, &mut waiting, &mut out)?;
                    }
                }
                Op::Advance(ms) => now = now + Duration::from_millis(ms),
            }
            // Overdue entries found by pop wait for `expire` and are not counted as waiting.
            prop_assert!(room.len() <= waiting.len());
        }
        for q in room.expire(Instant::from_millis(u64::MAX / 4)) {
            leave(q.id, &mut waiting, &mut out)?;
        }
        prop_assert!(waiting.is_empty(), "lost entries: {:?}", waiting);
        prop_assert!(room.is_empty());
    }
}

proptest! {
    #[test]
    fn drr_backlogged_tenants_share_by_weight(
        weights in prop::collection::vec(1u32..6, 2..5),
        quantum in 1u64..2_000,
        seed in any::<u64>(),
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut room = WaitingRoom::new(vec![class("batch", quantum, 64, 1_024, OverloadAction::Reject)]);
        let now = Instant::ZERO;
        for (i, &w) in weights.iter().enumerate() {
            for _ in 0..32 {
                room.push(entry("batch", &format!("t{i}"), w, rng.random_range(1..1_000), LATE, 0), now).unwrap();
            }
        }
        let mut served = vec![0u64; weights.len()];
        for _ in 0..3_000 {
            let q = room.pop_ready(now, |_| true).unwrap();
            let i: usize = q.entry.tenant[1..].parse().unwrap();
            served[i] += q.entry.cost;
            let cost = rng.random_range(1..1_000);
            room.push(entry("batch", &q.entry.tenant, weights[i], cost, LATE, 0), now).unwrap();
        }
        let total: u64 = served.iter().sum();
        let wsum: u32 = weights.iter().sum();
        for (i, &w) in weights.iter().enumerate() {
            let share = served[i] as f64 / total as f64;
            let want = f64::from(w) / f64::from(wsum);
            prop_assert!((share / want - 1.0).abs() <= 0.10, "tenant {} share {} want {} ({:?})", i, share, want, served);
        }
    }
}
