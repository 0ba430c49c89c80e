//! Flow-control classes on the wire (`--classes`): each request tagged with a priority and a
//! tenant exactly as the simulator's flow runs tag them ([`kvgate_sim::workload::classes`]: a
//! hash of the seed and the request id, so a live run and a simulated run of the same trace
//! and seed give every request the same class), sent as kvgate's flow-control headers, and
//! the results reported per group.
//!
//! - Priority: the header `x-kvgate-priority` with the class's priority when it is not 0
//!   (`--high-priority`, default 1, for a share `--high-share`, default 0.2).
//! - Tenant: the header `x-kvgate-tenant: tenant-K`, K in `0..--tenants` (default 10); tenant
//!   0 is the noisy one, drawn with weight `--noisy-factor` (default 10) against 1 for each
//!   other.
//! - `--noisy-keep F` keeps each of tenant 0's requests with probability F (the simulator's
//!   `thin_tenant` draw): `0.1` with the default factor is the run where the noisy tenant
//!   sends only its share, the other tenants' requests unchanged.
//!
//! The groups reported ([`ClassReport`]): high priority, normal priority, the quiet tenants
//! (1…), the noisy tenant (0), each with requests asked, served, TTFT percentiles and errors
//! by kind — the figures docs/decisions/flow-control.md gives for the simulator.

use std::collections::BTreeMap;

use kvgate_sim::cluster::SimClass;
use kvgate_sim::report::Percentiles;
use kvgate_sim::workload::classes::{self, ClassParams};
use serde::Serialize;

use crate::{Outcome, Planned};

/// The gateway's priority header (`kvgate_gateway::flow::PRIORITY_HEADER`).
pub const PRIORITY_HEADER: &str = "x-kvgate-priority";
/// The gateway's tenant header (`kvgate_gateway::flow::TENANT_HEADER`).
pub const TENANT_HEADER: &str = "x-kvgate-tenant";

/// The tenant header's value for tenant `k`.
pub fn tenant_name(k: u32) -> String {
    format!("tenant-{k}")
}

/// Tags every request and drops the noisy tenant's requests that `noisy_keep` thins away
/// (the others are kept, ids and arrival times unchanged).
pub fn tag_and_thin(
    requests: Vec<Planned>,
    params: &ClassParams,
    noisy_keep: f64,
) -> Vec<(Planned, SimClass)> {
    requests
        .into_iter()
        .map(|r| {
            let c = classes::class_of(r.id, params);
            (r, c)
        })
        .filter(|(r, c)| c.tenant != 0 || classes::kept(params.seed, r.id, noisy_keep))
        .collect()
}

/// One group's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupReport {
    pub requests: u64,
    pub served: u64,
    pub ttft_ms: Percentiles,
    pub errors: BTreeMap<String, u64>,
}

/// Results per class group (`--classes`), in [`crate::LoadgenReport::classes`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassReport {
    pub seed: u64,
    pub high_share: f64,
    pub tenants: u32,
    pub noisy_factor: f64,
    pub noisy_keep: f64,
    /// Priority > 0.
    pub high: GroupReport,
    /// Priority 0 (or below).
    pub normal: GroupReport,
    /// Tenants 1… (every priority).
    pub quiet_tenants: GroupReport,
    /// Tenant 0 (every priority).
    pub noisy_tenant: GroupReport,
}

fn group(
    outcomes: &[Outcome],
    classes: &[SimClass],
    pick: impl Fn(&SimClass) -> bool,
) -> GroupReport {
    let mut ttft = Vec::new();
    let mut errors = BTreeMap::new();
    let (mut requests, mut served) = (0, 0);
    for (o, c) in outcomes.iter().zip(classes) {
        if !pick(c) {
            continue;
        }
        requests += 1;
        match &o.error {
            Some(kind) => *errors.entry(kind.clone()).or_insert(0) += 1,
            None => {
                served += 1;
                if let Some(t) = o.ttft_ms {
                    ttft.push(t);
                }
            }
        }
    }
    GroupReport {
        requests,
        served,
        ttft_ms: Percentiles::of(&mut ttft),
        errors,
    }
}

/// The per-group report of a run (outcomes and classes by request position).
pub fn report(
    outcomes: &[Outcome],
    classes: &[SimClass],
    params: &ClassParams,
    noisy_keep: f64,
) -> ClassReport {
    ClassReport {
        seed: params.seed,
        high_share: params.high_share,
        tenants: params.tenants,
        noisy_factor: params.noisy_factor,
        noisy_keep,
        high: group(outcomes, classes, |c| c.priority > 0),
        normal: group(outcomes, classes, |c| c.priority <= 0),
        quiet_tenants: group(outcomes, classes, |c| c.tenant != 0),
        noisy_tenant: group(outcomes, classes, |c| c.tenant == 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PromptSource;

    fn planned(n: u64) -> Vec<Planned> {
        (0..n)
            .map(|id| Planned {
                id,
                arrival_ms: id as f64,
                input_tokens: 16,
                output_tokens: 1,
                source: PromptSource::Blocks(Vec::new()),
                session: None,
            })
            .collect()
    }

    #[test]
    fn tags_are_the_simulators_for_the_same_ids_and_seed() {
        let p = ClassParams {
            seed: 3,
            ..ClassParams::default()
        };
        let tagged = tag_and_thin(planned(500), &p, 1.0);
        assert_eq!(tagged.len(), 500);
        for (r, c) in &tagged {
            assert_eq!(*c, classes::class_of(r.id, &p));
        }
        assert!(tagged.iter().any(|(_, c)| c.priority == 1));
        assert!(tagged.iter().any(|(_, c)| c.tenant == 0));
        assert!(tagged.iter().any(|(_, c)| c.tenant == 9));
    }

    #[test]
    fn thinning_drops_only_noisy_requests_and_about_the_asked_share() {
        let p = ClassParams::default();
        let all = tag_and_thin(planned(20_000), &p, 1.0);
        let thin = tag_and_thin(planned(20_000), &p, 0.1);
        let quiet = |v: &[(Planned, SimClass)]| -> Vec<u64> {
            v.iter()
                .filter(|(_, c)| c.tenant != 0)
                .map(|(r, _)| r.id)
                .collect()
        };
        assert_eq!(quiet(&all), quiet(&thin));
        let noisy = |v: &[(Planned, SimClass)]| v.iter().filter(|(_, c)| c.tenant == 0).count();
        let ratio = noisy(&thin) as f64 / noisy(&all) as f64;
        assert!((ratio - 0.1).abs() < 0.02, "{ratio}");
    }

    #[test]
    fn groups_count_served_and_errors_per_class() {
        let ok = |t: f64| Outcome {
            sent_ms: 0.0,
            ttft_ms: Some(t),
            e2e_ms: t,
            output_tokens: 1,
            error: None,
            served_by: None,
            branch: None,
            queue_ms: None,
        };
        let err = |k: &str| Outcome {
            error: Some(k.into()),
            ttft_ms: None,
            ..ok(0.0)
        };
        let outcomes = [ok(10.0), ok(20.0), err("http_429"), ok(40.0)];
        let classes = [
            SimClass {
                priority: 1,
                tenant: 0,
            },
            SimClass {
                priority: 0,
                tenant: 1,
            },
            SimClass {
                priority: 0,
                tenant: 0,
            },
            SimClass {
                priority: 1,
                tenant: 2,
            },
        ];
        let r = report(&outcomes, &classes, &ClassParams::default(), 1.0);
        assert_eq!((r.high.requests, r.high.served), (2, 2));
        assert_eq!(r.high.ttft_ms.mean, 25.0);
        assert_eq!((r.normal.requests, r.normal.served), (2, 1));
        assert_eq!(r.normal.errors.get("http_429"), Some(&1));
        assert_eq!((r.noisy_tenant.requests, r.noisy_tenant.served), (2, 1));
        assert_eq!((r.quiet_tenants.requests, r.quiet_tenants.served), (2, 2));
        assert_eq!(r.quiet_tenants.ttft_ms.p50, 20.0);
    }
}
