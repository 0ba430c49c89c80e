//! Flow-control classes for a workload: each request tagged with a priority and a tenant, so
//! a simulated run ([`crate::cluster::run_classified`]) measures flow control per class.
//!
//! # Algorithm
//!
//! Every draw is a hash of (seed, request id, purpose) (SplitMix64), so a request's tags do not
//! depend on the other requests: thinning one tenant leaves every other request's tags as they
//! were.
//!
//! - **priority**: `high_priority` (default 1) with probability `high_share` (default 0.2),
//!   else 0.
//! - **tenant**: `tenants` tenants (default 10); tenant 0 (the noisy one) is drawn with weight
//!   `noisy_factor` (default 10), the others with weight 1 each: tenant 0 sends `noisy_factor`
//!   times each other tenant's share.
//!
//! [`thin_tenant`] keeps a tenant's requests with probability `keep` (the same hash), e.g.
//! `1 / noisy_factor` for the run where the noisy tenant sends only its share; the other
//! tenants' requests are identical in both runs (renumbered, arrival times unchanged).

use crate::SimRequest;
use crate::cluster::SimClass;

/// How requests are tagged; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassParams {
    pub seed: u64,
    pub high_share: f64,
    pub high_priority: i32,
    pub tenants: u32,
    pub noisy_factor: f64,
}

impl Default for ClassParams {
    fn default() -> Self {
        ClassParams {
            seed: 1,
            high_share: 0.2,
            high_priority: 1,
            tenants: 10,
            noisy_factor: 10.0,
        }
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A uniform draw in [0, 1) for (seed, id, purpose).
fn unit(seed: u64, id: u64, purpose: u64) -> f64 {
    let h = splitmix(seed ^ splitmix(id ^ splitmix(purpose)));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The class of the request with id `id` (its tags depend on nothing else).
pub fn class_of(id: u64, p: &ClassParams) -> SimClass {
    let tenants = p.tenants.max(1);
    let noisy = p.noisy_factor.max(0.0);
    let total = noisy + f64::from(tenants - 1);
    let priority = if unit(p.seed, id, 1) < p.high_share {
        p.high_priority
    } else {
        0
    };
    let x = unit(p.seed, id, 2) * total;
    let tenant = if x < noisy || tenants == 1 {
        0
    } else {
        (1 + ((x - noisy) as u32)).min(tenants - 1)
    };
    SimClass { priority, tenant }
}

/// The class of each request (by position).
pub fn tag(requests: &[SimRequest], p: &ClassParams) -> Vec<SimClass> {
    requests.iter().map(|r| class_of(r.id, p)).collect()
}

/// Whether thinning with probability `keep` keeps the request with id `id` ([`thin_tenant`]'s
/// draw, for drivers that thin their own request lists).
pub fn kept(seed: u64, id: u64, keep: f64) -> bool {
    unit(seed, id, 3) < keep
}

/// Keeps `tenant`'s requests with probability `keep` (all others always), renumbered from 0.
pub fn thin_tenant(
    requests: &[SimRequest],
    classes: &[SimClass],
    tenant: u32,
    keep: f64,
    seed: u64,
) -> (Vec<SimRequest>, Vec<SimClass>) {
    let mut out = Vec::new();
    let mut out_classes = Vec::new();
    for (r, c) in requests.iter().zip(classes) {
        if c.tenant == tenant && !kept(seed, r.id, keep) {
            continue;
        }
        let mut r = r.clone();
        r.id = out.len() as u64;
        out.push(r);
        out_classes.push(*c);
    }
    (out, out_classes)
}

/// TTFTs (ms) of the served requests whose class passes `pick`, from a classified run.
pub fn ttfts_where(
    ttft_ms_by_request: &[f64],
    classes: &[SimClass],
    pick: impl Fn(&SimClass) -> bool,
) -> (Vec<f64>, usize) {
    let mut out = Vec::new();
    let mut asked = 0;
    for (t, c) in ttft_ms_by_request.iter().zip(classes) {
        if pick(c) {
            asked += 1;
            if t.is_finite() {
                out.push(*t);
            }
        }
    }
    (out, asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reqs(n: u64) -> Vec<SimRequest> {
        (0..n)
            .map(|id| SimRequest {
                id,
                arrival_ms: id as f64,
                input_tokens: 16,
                output_tokens: 1,
                blocks: Vec::new(),
                adapter: None,
                session: None,
            })
            .collect()
    }

    #[test]
    fn shares_follow_the_parameters() {
        let r = reqs(20_000);
        let c = tag(&r, &ClassParams::default());
        let high = c.iter().filter(|c| c.priority == 1).count() as f64 / 20_000.0;
        let noisy = c.iter().filter(|c| c.tenant == 0).count() as f64 / 20_000.0;
        let t5 = c.iter().filter(|c| c.tenant == 5).count() as f64 / 20_000.0;
        assert!((high - 0.2).abs() < 0.01, "{high}");
        assert!((noisy - 10.0 / 19.0).abs() < 0.01, "{noisy}");
        assert!((t5 - 1.0 / 19.0).abs() < 0.005, "{t5}");
        assert!(c.iter().all(|c| c.tenant < 10));
    }

    #[test]
    fn thinning_one_tenant_leaves_the_others_requests_and_tags_alone() {
        let r = reqs(5000);
        let c = tag(&r, &ClassParams::default());
        let (thin, thin_c) = thin_tenant(&r, &c, 0, 0.1, 7);
        let others: Vec<_> = r
            .iter()
            .zip(&c)
            .filter(|(_, c)| c.tenant != 0)
            .map(|(r, c)| (r.arrival_ms, *c))
            .collect();
        let thin_others: Vec<_> = thin
            .iter()
            .zip(&thin_c)
            .filter(|(_, c)| c.tenant != 0)
            .map(|(r, c)| (r.arrival_ms, *c))
            .collect();
        assert_eq!(others, thin_others);
        let noisy_before = c.iter().filter(|c| c.tenant == 0).count() as f64;
        let noisy_after = thin_c.iter().filter(|c| c.tenant == 0).count() as f64;
        assert!((noisy_after / noisy_before - 0.1).abs() < 0.02);
        assert!(thin.iter().enumerate().all(|(i, r)| r.id == i as u64));
    }
}
