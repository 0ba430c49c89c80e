//! LoRA adapters: which adapters a pod has loaded, how many adapter slots it has, and what
//! sending a request to a pod that does not hold its adapter costs (sans IO).
//!
//! A vLLM pod started with `--enable-lora --max-loras N` serves its base model and its
//! adapters; a request names the adapter as its `model`. At most `max_lora` adapters are active
//! in one batch (vLLM 0.32, `../shared/reference/real-vllm.md`, "LoRA adapters"): a request for
//! another adapter is *deferred* (`vllm:num_requests_waiting_by_reason{reason="deferred"}`)
//! until a slot's requests have drained, then its adapter is loaded into the slot. Prefix
//! caching is per adapter (the engine's block hash includes it), so the router's block chain is
//! seeded by the adapter's name ([`crate::BlockHasher::chain_seed`] of the request's `model`) and
//! a request for adapter b never scores on blocks cached for a.
//!
//! # Per pod
//!
//! [`LoraSlots`] on the [`crate::PodSnapshot`] (`None`: the pod reports no LoRA, e.g. it runs
//! without `--enable-lora`; no adapter cost is charged there):
//! - `max_loras`, `running` and `deferred` come from the pod's `/metrics`: the newest series of
//!   `vllm:lora_requests_info` (the one with the highest value, a timestamp: old label sets
//!   linger) gives `max_lora` and `running_lora_adapters`; its `waiting_lora_adapters` is not
//!   read (in 0.32 it always equals the running list, an upstream bug);
//! - the session adds what kvgate itself routed ([`crate::session::adapter_book::AdapterBook`]): adapters with requests in
//!   flight on the pod count as running (the metric lags: an adapter shows only after its first
//!   output token, and only at the next scrape), and the last `max_loras` adapters routed there
//!   count as resident (vLLM keeps an adapter loaded after its requests end, until another
//!   needs the slot: least recently used first).
//!
//! # Fit and cost
//!
//! [`LoraSlots::fit`] places a request's adapter on a pod, in the order the router prefers:
//! 1. `Resident` (or `NoAdapter`: the request names the pod's base model) — 0 ms;
//! 2. `FreeSlot`: an empty slot (fewer adapters running or resident than `max_loras`) — the
//!    adapter is loaded first, `lora_load_ms`;
//! 3. `Evict`: every slot holds an adapter, but one of them has no running request — it is
//!    evicted for this one, `2 × lora_load_ms` (the load now, and the evicted adapter's reload
//!    when its next request comes: so an empty slot elsewhere is preferred and a warm adapter is
//!    not pushed out for nothing);
//! 4. `Full`: every slot is held by running requests of other adapters — the request waits for a
//!    slot, `lora_load_ms + lora_deferral_ms × (1 + deferred)` (each request already deferred on
//!    the pod is counted as one more wait).
//!
//! [`adapter_cost_ms`] is added to the pod's predicted TTFT by the router
//! ([`crate::Router::evaluate_cut`]) when `lora_aware` is on, so every policy that ranks by
//! predicted TTFT (the affinity gate, `latency`) prefers resident → free slot → others, and
//! trades the cost against queueing like any other delay.
//!
//! Parameters (`RouterConfig`):
//! - `lora_aware` = true: charge the cost (false: adapter-blind, for comparison).
//! - `lora_load_ms` = 25: loading a rank-8 adapter into a slot. Source: an estimate of the order
//!   of magnitude: a rank-8 adapter of a 7–8B model is tens of MB copied host → GPU (a few ms at
//!   PCIe rates) plus vLLM's slot activation; kvgate's own measurement on vLLM CPU with the tiny
//!   model is in docs/decisions/lora-aware.md — tune it for your model and hardware.
//! - `lora_deferral_ms` = 1000: one wait for a slot, i.e. the time the running requests of a
//!   resident adapter take to drain. Source: an estimate — half of a 256-token decode at
//!   ~8 ms/token (the simulator's H100 profile); the simulator's measurement of the policy with it
//!   is in docs/decisions/lora-aware.md.
//!
//! Bounds: an [`AdapterSet`] holds at most [`MAX_TRACKED_ADAPTERS`] ids (more are dropped and
//! not counted as running: the fit then errs towards `Resident`/`FreeSlot`, never a panic); the
//! session's adapter book keeps at most [`MAX_TRACKED_ADAPTERS`] entries per pod id, evicting the least
//! recently routed entry without requests in flight (a full book of in-flight adapters stops
//! recording new ones until one drains).

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

/// Most adapters one [`AdapterSet`] (and one pod's adapter book entry list) holds. vLLM's
/// `--max-loras` is 1–8 in practice (default 1).
pub const MAX_TRACKED_ADAPTERS: usize = 16;

/// Default `lora_load_ms` (see the module docs for its source).
pub const DEFAULT_LORA_LOAD_MS: f64 = 25.0;
/// Default `lora_deferral_ms` (see the module docs for its source).
pub const DEFAULT_LORA_DEFERRAL_MS: f64 = 1000.0;

/// An adapter (or a base model) by name: xxh3-64 of the name, as the chain seed hashes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize)]
pub struct AdapterId(pub u64);

impl AdapterId {
    pub fn of(name: &str) -> Self {
        AdapterId(xxh3_64(name.as_bytes()))
    }
}

/// A small set of adapters, inline (no allocation: snapshots are copied per decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdapterSet {
    ids: [AdapterId; MAX_TRACKED_ADAPTERS],
    len: u8,
}

impl AdapterSet {
    /// Adds `id`; false when the set is full (the id is not kept).
    pub fn insert(&mut self, id: AdapterId) -> bool {
        if self.contains(id) {
            return true;
        }
        match self.ids.get_mut(self.len as usize) {
            Some(slot) => {
                *slot = id;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    pub fn contains(&self, id: AdapterId) -> bool {
        self.as_slice().contains(&id)
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[AdapterId] {
        self.ids.get(..self.len as usize).unwrap_or(&[])
    }

    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut set = AdapterSet::default();
        for n in names {
            set.insert(AdapterId::of(n));
        }
        set
    }
}

/// A LoRA-enabled pod's adapter state at decision time; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoraSlots {
    /// Adapters active at once (`max_lora` of `vllm:lora_requests_info`, `--max-loras`).
    pub max_loras: u32,
    /// The pod's base model (a request naming it uses no adapter); `None` when unknown.
    pub base_model: Option<AdapterId>,
    /// Adapters with requests running, as the pod's metrics said (`running_lora_adapters`).
    pub running: AdapterSet,
    /// Adapters with requests in flight on the pod, as the session routed them (overwritten
    /// by every [`AdapterBook::fill`]).
    pub in_flight: AdapterSet,
    /// Adapters believed loaded without running requests: the last `max_loras` the session
    /// routed to the pod (overwritten by every [`AdapterBook::fill`]).
    pub resident: AdapterSet,
    /// `vllm:num_requests_waiting_by_reason{reason="deferred"}`: requests waiting for a slot.
    pub deferred: u32,
}

/// Where a request's adapter stands on one pod, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdapterFit {
    /// The request uses no adapter on this pod (its base model), or the pod reports no LoRA.
    #[default]
    NoAdapter,
    /// The adapter is loaded on the pod.
    Resident,
    /// Not loaded, but a slot is empty: loaded before the request runs.
    FreeSlot,
    /// Not loaded; every slot holds an adapter, one of them idle: evicted for this one.
    Evict,
    /// Not loaded and every slot is held by running requests: the request is deferred.
    Full,
}

impl AdapterFit {
    /// The llm-d lora-affinity tier: 0 for a pod already serving the adapter (or needing none),
    /// 1 with a free slot, 2 otherwise.
    pub fn tier(self) -> u8 {
        match self {
            AdapterFit::NoAdapter | AdapterFit::Resident => 0,
            AdapterFit::FreeSlot | AdapterFit::Evict => 1,
            AdapterFit::Full => 2,
        }
    }
}

impl LoraSlots {
    /// Distinct adapters holding a slot: running by the metric or in flight by the session.
    pub fn active(&self) -> usize {
        let extra = self
            .in_flight
            .as_slice()
            .iter()
            .filter(|a| !self.running.contains(**a))
            .count();
        self.running.len() + extra
    }

    /// Distinct adapters in a slot: active or resident.
    pub fn occupied(&self) -> usize {
        let extra = self
            .resident
            .as_slice()
            .iter()
            .filter(|a| !self.running.contains(**a) && !self.in_flight.contains(**a))
            .count();
        self.active() + extra
    }

    pub fn fit(&self, adapter: AdapterId) -> AdapterFit {
        if self.base_model == Some(adapter) {
            AdapterFit::NoAdapter
        } else if self.running.contains(adapter)
            || self.in_flight.contains(adapter)
            || self.resident.contains(adapter)
        {
            AdapterFit::Resident
        } else if (self.occupied() as u32) < self.max_loras.max(1) {
            AdapterFit::FreeSlot
        } else if (self.active() as u32) < self.max_loras.max(1) {
            AdapterFit::Evict
        } else {
            AdapterFit::Full
        }
    }
}

/// The fit of `adapter` on a pod with `slots` (`None` on either side: no adapter involved).
pub fn adapter_fit(slots: Option<&LoraSlots>, adapter: Option<AdapterId>) -> AdapterFit {
    match (slots, adapter) {
        (Some(s), Some(a)) => s.fit(a),
        _ => AdapterFit::NoAdapter,
    }
}

/// Milliseconds added to a pod's predicted TTFT for `fit` (module docs: the formula).
pub fn adapter_cost_ms(fit: AdapterFit, deferred: u32, load_ms: f64, deferral_ms: f64) -> f64 {
    match fit {
        AdapterFit::NoAdapter | AdapterFit::Resident => 0.0,
        AdapterFit::FreeSlot => load_ms,
        AdapterFit::Evict => 2.0 * load_ms,
        AdapterFit::Full => load_ms + deferral_ms * (1.0 + f64::from(deferred)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Slots of a pod serving `base` with `running` adapters (shared with the adapter book's tests).
    pub(crate) fn slots(max_loras: u32, running: &[&str]) -> LoraSlots {
        LoraSlots {
            max_loras,
            base_model: Some(AdapterId::of("base")),
            running: AdapterSet::from_names(running.iter().copied()),
            ..LoraSlots::default()
        }
    }

    #[test]
    fn fit_prefers_resident_then_free_slot_then_full() {
        let a = AdapterId::of("a");
        let b = AdapterId::of("b");
        assert_eq!(slots(1, &["a"]).fit(a), AdapterFit::Resident);
        assert_eq!(slots(2, &["a"]).fit(b), AdapterFit::FreeSlot);
        assert_eq!(slots(1, &["a"]).fit(b), AdapterFit::Full);
        assert_eq!(
            slots(1, &["a"]).fit(AdapterId::of("base")),
            AdapterFit::NoAdapter
        );
        assert!(AdapterFit::Resident < AdapterFit::FreeSlot);
        assert!(AdapterFit::FreeSlot < AdapterFit::Evict);
        assert!(AdapterFit::Evict < AdapterFit::Full);
        let mut idle_a = slots(1, &[]);
        idle_a.resident.insert(a);
        assert_eq!(idle_a.fit(b), AdapterFit::Evict, "a loaded, not running");
    }

    #[test]
    fn cost_is_zero_resident_load_with_a_free_slot_and_load_plus_waits_when_full() {
        assert_eq!(adapter_cost_ms(AdapterFit::Resident, 3, 25.0, 1000.0), 0.0);
        assert_eq!(adapter_cost_ms(AdapterFit::FreeSlot, 3, 25.0, 1000.0), 25.0);
        assert_eq!(adapter_cost_ms(AdapterFit::Evict, 3, 25.0, 1000.0), 50.0);
        assert_eq!(adapter_cost_ms(AdapterFit::Full, 0, 25.0, 1000.0), 1025.0);
        assert_eq!(adapter_cost_ms(AdapterFit::Full, 2, 25.0, 1000.0), 3025.0);
    }

    #[test]
    fn adapter_set_drops_ids_beyond_its_bound() {
        let mut set = AdapterSet::default();
        for i in 0..MAX_TRACKED_ADAPTERS as u64 {
            assert!(set.insert(AdapterId(i)));
        }
        assert!(set.insert(AdapterId(0)), "already present");
        assert!(!set.insert(AdapterId(1000)));
        assert_eq!(set.len(), MAX_TRACKED_ADAPTERS);
    }
}
