use super::*;
use proptest::prelude::*;

fn on() -> FlowConfig {
    FlowConfig {
        enabled: true,
        ..FlowConfig::default()
    }
}

fn req(priority: i32, tenant: &str) -> FlowRequest<'_> {
    FlowRequest {
        priority,
        tenant,
        cost_tokens: 100,
        bytes: 10,
        deadline_ms: f64::INFINITY,
    }
}

const FULL: Saturation = Saturation::Headroom(0);

fn queued<T: std::fmt::Debug>(o: Offer<T>) -> EntryId {
    match o {
        Offer::Queued(id, evicted) if evicted.is_empty() => id,
        other => panic!("expected queued, got {other:?}"),
    }
}

fn drain(q: &mut FlowQueue<u32>) -> Vec<u32> {
    std::iter::from_fn(|| q.pop(0.0).map(|l| l.payload)).collect()
}

#[test]
fn off_dispatches_everything_whatever_the_fleet() {
    let mut q = FlowQueue::new();
    let cfg = FlowConfig::default();
    assert!(!cfg.enabled);
    for sat in [FULL, Saturation::Unavailable] {
        assert!(matches!(
            q.offer(&cfg, req(-5, "a"), sat, 0.0, 1),
            Offer::Dispatch(1)
        ));
    }
    assert!(q.is_empty());
}

#[test]
fn an_empty_queue_with_headroom_dispatches_at_once_and_a_saturated_fleet_queues() {
    let mut q = FlowQueue::new();
    let cfg = on();
    assert!(matches!(
        q.offer(&cfg, req(0, "a"), Saturation::Headroom(1), 0.0, 1),
        Offer::Dispatch(1)
    ));
    queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, 2));
    // Headroom again, but the queue holds someone: the newcomer queues behind.
    queued(q.offer(&cfg, req(0, "a"), Saturation::Headroom(3), 0.0, 3));
    assert_eq!(drain(&mut q), vec![2, 3]);
}

#[test]
fn no_healthy_pod_is_503_not_a_queue() {
    let mut q = FlowQueue::new();
    match q.offer(&on(), req(5, "a"), Saturation::Unavailable, 0.0, 1) {
        Offer::Rejected(r, 1) => {
            assert_eq!(r, Rejection::Unavailable);
            assert_eq!(r.status(), 503);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn sheddable_requests_are_rejected_when_they_would_wait_and_served_when_not() {
    let mut q = FlowQueue::new();
    let cfg = on();
    assert!(matches!(
        q.offer(&cfg, req(-1, "a"), Saturation::Headroom(1), 0.0, 1),
        Offer::Dispatch(1)
    ));
    match q.offer(&cfg, req(-1, "a"), FULL, 0.0, 2) {
        Offer::Rejected(Rejection::Sheddable, 2) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(Rejection::Sheddable.status(), 429);
    assert!(q.is_empty());
}

#[test]
fn a_higher_band_always_leaves_first() {
    let mut q = FlowQueue::new();
    let cfg = on();
    queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, 1));
    queued(q.offer(&cfg, req(0, "b"), FULL, 1.0, 2));
    queued(q.offer(&cfg, req(3, "a"), FULL, 2.0, 3));
    queued(q.offer(&cfg, req(1, "c"), FULL, 3.0, 4));
    // Priorities beyond the range share the edge band.
    queued(q.offer(&cfg, req(1000, "c"), FULL, 4.0, 5));
    // Band 0 last: "b" before "a", whose band-3 request was already service it attained
    // (attained service is the tenant's, across bands).
    assert_eq!(drain(&mut q), vec![5, 3, 4, 2, 1]);
}

#[test]
fn within_a_band_the_least_served_tenant_goes_next() {
    let mut q = FlowQueue::new();
    let cfg = on();
    // The noisy tenant queues ten, the quiet one two, later.
    for i in 0..10 {
        queued(q.offer(&cfg, req(0, "noisy"), FULL, f64::from(i), i));
    }
    queued(q.offer(&cfg, req(0, "quiet"), FULL, 20.0, 100));
    queued(q.offer(&cfg, req(0, "quiet"), FULL, 21.0, 101));
    let order = drain(&mut q);
    // Noisy's oldest first (all at 0 attained, earliest head), then they alternate while both
    // are backlogged, then noisy's rest.
    assert_eq!(order, vec![0, 100, 1, 101, 2, 3, 4, 5, 6, 7, 8, 9]);
}

#[test]
fn fairness_counts_tokens_not_requests() {
    let mut q = FlowQueue::new();
    let cfg = on();
    let big = FlowRequest {
        cost_tokens: 1000,
        ..req(0, "big")
    };
    for i in 0..3 {
        queued(q.offer(&cfg, big, FULL, 0.0, i));
    }
    for i in 0..12 {
        queued(q.offer(&cfg, req(0, "small"), FULL, 1.0, 10 + i));
    }
    let order = drain(&mut q);
    // One 1000-token request buys "small" ten 100-token ones before "big" goes again.
    assert_eq!(order[0], 0);
    assert_eq!(&order[1..11], &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
    assert_eq!(order[11], 1);
}

#[test]
fn an_idle_tenant_cannot_bank_credit() {
    let mut q = FlowQueue::new();
    let cfg = on();
    // "a" is served 5 × 100 tokens alone; "late" joins the backlog afterwards.
    for i in 0..5 {
        queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, i));
    }
    for _ in 0..4 {
        q.pop(0.0);
    }
    let late = q.tenant(&cfg, "late", 0.0);
    // It starts at the virtual time (a's attained when last served), not at zero.
    assert_eq!(q.attained_tokens(late), 300.0);
    queued(q.offer(&cfg, req(0, "late"), FULL, 1.0, 50));
    queued(q.offer(&cfg, req(0, "late"), FULL, 1.0, 51));
    queued(q.offer(&cfg, req(0, "a"), FULL, 1.0, 5));
    // a: 400 attained; late: 300 → late, then both at 400: a's older head, then late.
    assert_eq!(drain(&mut q), vec![50, 4, 51, 5]);
}

#[test]
fn a_tenant_past_its_share_of_the_queue_gets_429() {
    let mut q = FlowQueue::new();
    let cfg = FlowConfig {
        max_queued_requests: 8,
        tenant_max_share: 0.5,
        ..on()
    };
    assert_eq!(cfg.tenant_cap(), 4);
    for i in 0..4 {
        queued(q.offer(&cfg, req(0, "noisy"), FULL, 0.0, i));
    }
    match q.offer(&cfg, req(0, "noisy"), FULL, 0.0, 9) {
        Offer::Rejected(Rejection::TenantShare, 9) => {}
        other => panic!("{other:?}"),
    }
    queued(q.offer(&cfg, req(0, "quiet"), FULL, 0.0, 10));
}

#[test]
fn a_full_queue_evicts_the_newest_of_the_lowest_band_from_its_largest_tenant() {
    let mut q = FlowQueue::new();
    let cfg = FlowConfig {
        max_queued_requests: 4,
        tenant_max_share: 1.0,
        ..on()
    };
    queued(q.offer(&cfg, req(0, "x"), FULL, 0.0, 1));
    queued(q.offer(&cfg, req(0, "x"), FULL, 1.0, 2));
    queued(q.offer(&cfg, req(0, "y"), FULL, 2.0, 3));
    queued(q.offer(&cfg, req(2, "y"), FULL, 3.0, 4));
    // Same band as the lowest: nothing less important to make room with.
    match q.offer(&cfg, req(0, "z"), FULL, 4.0, 5) {
        Offer::Rejected(Rejection::QueueFull, 5) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(q.len(), 4);
    match q.offer(&cfg, req(1, "z"), FULL, 5.0, 6) {
        Offer::Queued(_, evicted) => {
            let e: Vec<_> = evicted.iter().map(|l| (l.payload, l.band)).collect();
            assert_eq!(e, vec![(2, 0)]);
            assert_eq!(evicted[0].queued_ms, 4.0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(drain(&mut q), vec![4, 6, 1, 3]);
}

#[test]
fn queued_bytes_are_bounded() {
    let mut q = FlowQueue::new();
    let cfg = FlowConfig {
        max_queued_bytes: 25,
        ..on()
    };
    queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, 1));
    queued(q.offer(&cfg, req(0, "b"), FULL, 0.0, 2));
    assert_eq!(q.bytes(), 20);
    assert!(matches!(
        q.offer(&cfg, req(0, "c"), FULL, 0.0, 3),
        Offer::Rejected(Rejection::QueueFull, 3)
    ));
    let huge = FlowRequest {
        bytes: 26,
        ..req(5, "c")
    };
    assert!(matches!(
        q.offer(&cfg, huge, FULL, 0.0, 4),
        Offer::Rejected(Rejection::QueueFull, 4)
    ));
    // A higher band makes room by evicting.
    match q.offer(&cfg, req(1, "c"), FULL, 0.0, 5) {
        Offer::Queued(_, ev) => assert_eq!(ev.len(), 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.bytes(), 20);
}

#[test]
fn entries_expire_at_the_ttl_or_their_own_deadline_whichever_is_first() {
    let mut q = FlowQueue::new();
    let cfg = FlowConfig {
        queue_ttl_ms: 100,
        ..on()
    };
    queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, 1));
    let tight = FlowRequest {
        deadline_ms: 50.0,
        ..req(0, "a")
    };
    queued(q.offer(&cfg, tight, FULL, 10.0, 2));
    assert!(q.expire(49.0).is_empty());
    let e: Vec<_> = q
        .expire(50.0)
        .into_iter()
        .map(|(l, why)| (l.payload, why, l.queued_ms))
        .collect();
    assert_eq!(e, vec![(2, Expiry::Deadline, 40.0)]);
    assert!(q.expire(99.9).is_empty());
    let e: Vec<_> = q
        .expire(100.0)
        .into_iter()
        .map(|(l, why)| (l.payload, why))
        .collect();
    assert_eq!(e, vec![(1, Expiry::Ttl)]);
    assert!(q.is_empty());
}

#[test]
fn a_removed_entry_leaves_once() {
    let mut q = FlowQueue::new();
    let cfg = on();
    let a = queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, 1));
    queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, 2));
    assert_eq!(
        q.remove(a, 5.0).map(|l| (l.payload, l.queued_ms)),
        Some((1, 5.0))
    );
    assert!(q.remove(a, 6.0).is_none());
    assert_eq!(drain(&mut q), vec![2]);
}

#[test]
fn tenants_beyond_max_tenants_share_other() {
    let mut q: FlowQueue<u32> = FlowQueue::new();
    let cfg = FlowConfig {
        max_tenants: 2,
        ..on()
    };
    let a = q.tenant(&cfg, "a", 0.0);
    let b = q.tenant(&cfg, "b", 0.0);
    let c = q.tenant(&cfg, "c", 0.0);
    let d = q.tenant(&cfg, "d", 0.0);
    assert_ne!(a, b);
    assert_eq!(c, d);
    assert_eq!(q.tenant_name(c), OTHER_TENANT);
    assert_eq!(q.tenant(&cfg, "a", 0.0), a);
    assert!(q.take_forgotten().is_empty());
}

#[test]
fn a_new_tenant_takes_the_place_of_the_longest_idle_one_with_nothing_queued() {
    let mut q: FlowQueue<u32> = FlowQueue::new();
    let cfg = FlowConfig {
        max_tenants: 2,
        tenant_idle_ms: 1_000,
        ..on()
    };
    // "a" is seen at 0 and has a request queued; "b" is seen at 100, nothing queued.
    queued(q.offer(&cfg, req(0, "a"), FULL, 0.0, 1));
    let b = q.tenant(&cfg, "b", 100.0);
    // Before b has been idle for tenant_idle_ms, a newcomer shares "other".
    let early = q.tenant(&cfg, "c", 1_050.0);
    assert_eq!(q.tenant_name(early), OTHER_TENANT);
    // Once it has, "c" takes b's place (a is older but holds a queued request).
    let c = q.tenant(&cfg, "c", 1_100.0);
    assert_eq!(c, b);
    assert_eq!(q.tenant_name(c), "c");
    assert_eq!(q.take_forgotten(), vec!["b".to_string()]);
    assert!(q.take_forgotten().is_empty());
    // "b" comes back: no idle place (c was just seen, a still queued, "other" never given).
    let b_again = q.tenant(&cfg, "b", 1_200.0);
    assert_eq!(q.tenant_name(b_again), OTHER_TENANT);
    // a's request leaves; once a is idle long enough, b gets a's place.
    assert_eq!(q.pop(1_300.0).map(|l| l.payload), Some(1));
    let b_back = q.tenant(&cfg, "b", 1_300.0 + 1_000.0);
    assert_eq!(q.tenant_name(b_back), "b");
    assert_eq!(q.take_forgotten(), vec!["a".to_string()]);
}

#[test]
fn a_tenant_seen_again_keeps_its_place() {
    let mut q: FlowQueue<u32> = FlowQueue::new();
    let cfg = FlowConfig {
        max_tenants: 1,
        tenant_idle_ms: 1_000,
        ..on()
    };
    let a = q.tenant(&cfg, "a", 0.0);
    assert_eq!(q.tenant(&cfg, "a", 900.0), a);
    // Seen at 900: at 1,500 it is idle for 600 ms only.
    let z = q.tenant(&cfg, "z", 1_500.0);
    assert_eq!(q.tenant_name(z), OTHER_TENANT);
    let z = q.tenant(&cfg, "z", 1_900.0);
    assert_eq!(q.tenant_name(z), "z");
}

#[test]
fn config_defaults_are_off_and_bad_values_are_refused() {
    let d = FlowConfig::default();
    assert!(!d.enabled);
    assert_eq!(d.max_queued_requests, 1024);
    assert_eq!(d.queue_ttl_ms, 30_000);
    assert_eq!(d.saturation.queue_depth_threshold, 5);
    assert_eq!(d.saturation.bulk_kv_reserve, 0.3);
    assert_eq!(d.saturation.bulk_queue_reserve, 4);
    assert!(d.validate().is_ok());
    for bad in [
        FlowConfig {
            max_queued_requests: 0,
            ..d
        },
        FlowConfig {
            queue_ttl_ms: 0,
            ..d
        },
        FlowConfig {
            tenant_max_share: 0.0,
            ..d
        },
        FlowConfig {
            tenant_max_share: f64::NAN,
            ..d
        },
        FlowConfig {
            max_tenants: MAX_TENANTS_LIMIT + 1,
            ..d
        },
        FlowConfig {
            saturation: SaturationConfig {
                bulk_kv_reserve: 0.8,
                ..d.saturation
            },
            ..d
        },
        FlowConfig {
            saturation: SaturationConfig {
                bulk_kv_reserve: -0.1,
                ..d.saturation
            },
            ..d
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
    let parsed: FlowConfig =
        serde_json::from_str(r#"{"enabled": true, "saturation": {"queue_depth_threshold": 2}}"#)
            .unwrap();
    assert!(parsed.enabled);
    assert_eq!(parsed.saturation.queue_depth_threshold, 2);
    assert_eq!(parsed.saturation.kv_cache_util_threshold, 0.8);
    assert!(serde_json::from_str::<FlowConfig>(r#"{"enabld": true}"#).is_err());
}

#[test]
fn the_tenant_holding_most_of_the_queue_is_bulk_and_can_be_passed_over() {
    let mut q = FlowQueue::new();
    let cfg = on();
    // One queued request is never bulk (nobody else to make room for).
    queued(q.offer(&cfg, req(0, "noisy"), FULL, 0.0, 1));
    assert_eq!(q.next_is_bulk(&cfg, 3.0), Some(false));
    queued(q.offer(&cfg, req(0, "noisy"), FULL, 0.0, 2));
    queued(q.offer(&cfg, req(0, "noisy"), FULL, 0.0, 3));
    // The noisy tenant holds 3 of 3: its next request is bulk.
    assert_eq!(q.next_is_bulk(&cfg, 3.0), Some(true));
    queued(q.offer(&cfg, req(0, "quiet"), FULL, 1.0, 4));
    queued(q.offer(&cfg, req(1, "noisy"), FULL, 2.0, 5));
    // A higher band is never bulk, whoever sends it, and leaves first.
    assert_eq!(q.next_is_bulk(&cfg, 3.0), Some(false));
    assert_eq!(q.pop_non_bulk(&cfg, 3.0).map(|l| l.payload), Some(5));
    // Band 0: noisy was served 100 tokens (request 5), quiet none: quiet goes next.
    assert_eq!(q.next_is_bulk(&cfg, 3.0), Some(false));
    assert_eq!(q.pop(3.0).map(|l| l.payload), Some(4));
    // Only the noisy tenant left (3 of 3): bulk; passing over it finds nothing.
    assert_eq!(q.next_is_bulk(&cfg, 3.0), Some(true));
    assert!(q.pop_non_bulk(&cfg, 3.0).is_none());
    assert_eq!(q.len(), 3);
    assert_eq!(drain(&mut q), vec![1, 2, 3]);
    assert_eq!(q.next_is_bulk(&cfg, 3.0), None);
}

#[test]
fn passing_over_the_bulk_tenant_serves_the_others_in_their_order() {
    let mut q = FlowQueue::new();
    let cfg = on();
    for i in 0..4 {
        queued(q.offer(&cfg, req(0, "noisy"), FULL, 0.0, i));
    }
    queued(q.offer(&cfg, req(0, "a"), FULL, 1.0, 10));
    queued(q.offer(&cfg, req(0, "b"), FULL, 2.0, 11));
    // Noisy's head is oldest and all are unserved: pop would take it; it is bulk.
    assert_eq!(q.next_is_bulk(&cfg, 3.0), Some(true));
    assert_eq!(q.pop_non_bulk(&cfg, 3.0).map(|l| l.payload), Some(10));
    assert_eq!(q.pop_non_bulk(&cfg, 3.0).map(|l| l.payload), Some(11));
    assert!(q.pop_non_bulk(&cfg, 3.0).is_none());
    assert_eq!(q.pop(3.0).map(|l| l.payload), Some(0));
}

#[derive(Debug, Clone)]
enum Op {
    Offer {
        priority: i32,
        tenant: u8,
        headroom: u32,
    },
    Pop,
    Expire(u16),
    Remove(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (-2i32..4, 0u8..5, 0u32..2).prop_map(|(priority, tenant, headroom)| Op::Offer {
            priority,
            tenant,
            headroom
        }),
        Just(Op::Pop),
        (0u16..200).prop_map(Op::Expire),
        (0u8..50).prop_map(Op::Remove),
    ]
}

proptest! {
    /// Every request offered leaves exactly once (dispatched, refused, evicted, popped,
    /// expired, removed or drained at the end), and the counters match the contents.
    #[test]
    fn nothing_offered_is_lost_or_duplicated(ops in proptest::collection::vec(op(), 0..300)) {
        let cfg = FlowConfig {
            max_queued_requests: 6,
            max_queued_bytes: 45,
            queue_ttl_ms: 100,
            tenant_max_share: 0.5,
            max_tenants: 3,
            ..on()
        };
        let mut q: FlowQueue<u32> = FlowQueue::new();
        let mut seen = vec![0u32; ops.len()];
        let mut ids = Vec::new();
        let mut now = 0.0;
        for (i, op) in ops.iter().enumerate() {
            now += 1.0;
            let i = i as u32;
            match *op {
                Op::Offer { priority, tenant, headroom } => {
                    let name = format!("t{tenant}");
                    let r = FlowRequest { bytes: 7, ..req(priority, &name) };
                    match q.offer(&cfg, r, Saturation::Headroom(headroom), now, i) {
                        Offer::Dispatch(p) | Offer::Rejected(_, p) => seen[p as usize] += 1,
                        Offer::Queued(id, ev) => {
                            ids.push(id);
                            for l in ev { seen[l.payload as usize] += 1; }
                        }
                    }
                }
                Op::Pop => if let Some(l) = q.pop(now) { seen[l.payload as usize] += 1 },
                Op::Expire(dt) => for (l, _) in q.expire(now + f64::from(dt)) {
                    seen[l.payload as usize] += 1;
                },
                Op::Remove(k) => if let Some(&id) = ids.get(k as usize)
                    && let Some(l) = q.remove(id, now) {
                    seen[l.payload as usize] += 1;
                },
            }
            prop_assert!(q.len() <= cfg.max_queued_requests);
            prop_assert!(q.bytes() <= cfg.max_queued_bytes);
            let by_class: usize = q.queued_by_class().iter().map(|c| c.2).sum();
            prop_assert_eq!(by_class, q.len());
            prop_assert_eq!(q.bytes(), 7 * q.len() as u64);
        }
        while let Some(l) = q.pop(now) { seen[l.payload as usize] += 1; }
        for (i, op) in ops.iter().enumerate() {
            let want = u32::from(matches!(op, Op::Offer { .. }));
            prop_assert_eq!(seen[i], want, "request {} ({:?})", i, op);
        }
    }
}

/// Headroom for 10 requests, none under the bulk KV threshold.
const NO_BULK_ROOM: Room = Room {
    saturation: Saturation::Headroom(10),
    bulk_headroom: 0,
};

#[track_caller]
fn dispatched<T: std::fmt::Debug>(o: Offer<T>) {
    assert!(
        matches!(o, Offer::Dispatch(_)),
        "expected dispatch, got {o:?}"
    );
}

#[test]
fn a_flooding_tenant_waits_at_the_door_without_bulk_headroom_while_the_others_go_at_once() {
    let mut q = FlowQueue::new();
    let cfg = on();
    for (i, t) in ["a", "b", "c"].into_iter().enumerate() {
        let r = FlowRequest {
            cost_tokens: 160,
            ..req(0, t)
        };
        dispatched(q.offer(&cfg, r, NO_BULK_ROOM, i as f64, i as u32));
    }
    // 100, 200, 300 tokens are not more than twice the others' mean (160): dispatched.
    for i in 10..13 {
        dispatched(q.offer(&cfg, req(0, "noisy"), NO_BULK_ROOM, 3.0, i));
    }
    // 400 is: the flood waits in the queue although the fleet has headroom.
    queued(q.offer(&cfg, req(0, "noisy"), NO_BULK_ROOM, 5.0, 13));
    let noisy = q.tenant(&cfg, "noisy", 5.0);
    assert!(q.is_bulk(&cfg, noisy, 0, 5.0));
    // Its high-priority requests are never bulk.
    assert!(!q.is_bulk(&cfg, noisy, 1, 5.0));
    // A quiet tenant's request queues behind it and is released past the flood.
    queued(q.offer(&cfg, req(0, "a"), NO_BULK_ROOM, 6.0, 14));
    assert_eq!(q.next_is_bulk(&cfg, 6.0), Some(true));
    assert_eq!(q.pop_non_bulk(&cfg, 6.0).map(|l| l.payload), Some(14));
    assert!(q.pop_non_bulk(&cfg, 6.0).is_none());
    // With bulk headroom the flood goes (the driver's pop).
    assert_eq!(q.pop(6.0).map(|l| l.payload), Some(13));
    // A minute later the others are no longer seen within the window: nobody floods.
    dispatched(q.offer(&cfg, req(0, "noisy"), NO_BULK_ROOM, 70_000.0, 15));
    assert!(!q.is_bulk(&cfg, noisy, 0, 70_000.0));
}

#[test]
fn a_lone_tenant_never_floods_and_a_zero_window_turns_the_rule_off() {
    let mut q = FlowQueue::new();
    let cfg = on();
    for i in 0..50 {
        dispatched(q.offer(&cfg, req(0, "only"), NO_BULK_ROOM, f64::from(i), i));
    }
    let off = FlowConfig {
        bulk_window_ms: 0,
        ..on()
    };
    let mut q = FlowQueue::new();
    dispatched(q.offer(&off, req(0, "quiet"), NO_BULK_ROOM, 0.0, 0));
    for i in 1..50 {
        dispatched(q.offer(&off, req(0, "noisy"), NO_BULK_ROOM, f64::from(i), i));
    }
    assert!(q.is_empty());
}

#[test]
fn flooding_is_measured_in_tokens_decayed_over_the_window() {
    let mut q = FlowQueue::new();
    let cfg = on();
    let big = |t| FlowRequest {
        cost_tokens: 1000,
        ..req(0, t)
    };
    dispatched(q.offer(&cfg, req(0, "a"), NO_BULK_ROOM, 0.0, 0));
    dispatched(q.offer(&cfg, req(0, "b"), NO_BULK_ROOM, 0.0, 1));
    // One request of 1,000 tokens against the others' 100 each: flooding at once.
    queued(q.offer(&cfg, big("noisy"), NO_BULK_ROOM, 0.0, 2));
    assert_eq!(q.pop(0.0).map(|l| l.payload), Some(2));
    // 30 s later (3 time constants) its 1,000 tokens count ≈ 50; a and b send again.
    dispatched(q.offer(&cfg, req(0, "a"), NO_BULK_ROOM, 30_000.0, 3));
    dispatched(q.offer(&cfg, req(0, "b"), NO_BULK_ROOM, 30_000.0, 4));
    dispatched(q.offer(&cfg, req(0, "noisy"), NO_BULK_ROOM, 30_000.0, 5));
}
