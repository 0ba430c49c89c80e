//! Flow control, sans IO: a router-side queue that holds requests while the fleet is saturated
//! and releases them by priority band, then fairly across tenants.
//!
//! The gateway (HTTP proxy and ext_proc picker, `kvgate-gateway/src/pipeline/flow.rs`) and the simulator
//! (`kvgate-sim/src/cluster.rs`) drive the same [`FlowQueue`]: they offer each request with its
//! class and the fleet's [`Saturation`] ([`saturation`]), release entries while the fleet has
//! headroom, and expire entries at their deadline. Time is passed in (`now_ms`); nothing here
//! reads a clock.
//!
//! # Classes
//!
//! - **priority**: an `i32`, higher is more important, negative is *sheddable* (llm-d's
//!   convention). Clamped to `[MIN_PRIORITY, MAX_PRIORITY]` = `[-16, 16]`, so there are at most
//!   33 bands. (vLLM's `priority` body field is the other way round, lower first: the gateway
//!   negates when it reads or writes it.)
//! - **tenant**: a name (API key or header, chosen by the driver). At most `max_tenants`
//!   names (default 64) are tracked each on their own; a new name takes the place of a tracked
//!   tenant that has nothing queued and was last seen `tenant_idle_ms` (default 300,000) ago
//!   or more (the longest idle first: its fairness state is only its attained service, which
//!   a backlogged newcomer would start at the virtual time anyway), else it shares the tenant
//!   [`OTHER_TENANT`]. This bounds the fairness state and every per-tenant metric label; the
//!   driver drops a forgotten name's series ([`FlowQueue::take_forgotten`]).
//!
//! # Discipline: strict priority bands, least attained service across tenants within a band
//!
//! 1. **Band**: the highest non-empty priority band goes first, always (strict priority). The
//!    operator's priorities are a promise ("interactive before batch"); weighted sharing between
//!    bands would let a flood of batch work delay interactive requests, which is what the issue
//!    asks to prevent. Starvation of low bands is bounded by the TTL: they are answered (503
//!    `flow_queue_ttl`), never held for ever.
//! 2. **Tenant, within the band**: the backlogged tenant with the least *attained service*, in
//!    tokens (prompt + `max_tokens`, the driver's `cost_tokens`) released from the queue so far;
//!    ties by the earliest head, then entry id. Why this and not deficit round robin: DRR's
//!    fairness depends on a quantum that must exceed the largest request (prompts range from
//!    10 to 100k tokens), and counts requests rather than work unless weighted; least attained
//!    service by tokens is work-conserving, needs no quantum, and a tenant sending 10× its
//!    share of tokens is served its fair share and waits for the rest, as in llm-d's
//!    least-attained-service fairness and fair queueing generally.
//!    A tenant that becomes backlogged starts at `max(its attained, the virtual time)`, the
//!    virtual time being the attained service of the last tenant served from the queue (start-
//!    time fair queueing): a tenant idle for an hour cannot bank credit and then starve the
//!    others. Only releases from the queue count: requests dispatched at once while the fleet
//!    has headroom contend with no one.
//! 3. **Within a tenant**: first come, first served.
//!
//! # Headroom kept for the others: bulk requests
//!
//! Requests are not preempted once dispatched, so a fleet filled to its thresholds by one
//! flooding tenant makes every other arrival wait for a completion. So a *bulk* request — band
//! ≤ 0, from the *bulk tenant* (the one holding more than half of the queued requests, at
//! least two queued) or from a *flooding* tenant (over the last `bulk_window_ms`, decayed
//! exponentially with that time constant, it offered more than twice the tokens the other
//! tenants seen in that window offered on average; a lone tenant never floods) — leaves only
//! into the fleet's *bulk headroom*: the saturation detector's
//! with the KV threshold lowered by `saturation.bulk_kv_reserve` (default 0.3: 0.8 − 0.3 = 0.5
//! of KV) and the queue depth by `saturation.bulk_queue_reserve` (default 4: 5 − 4 = 1, only a
//! pod with no queue; docs/decisions/flow-control.md). The driver asks [`FlowQueue::next_is_bulk`]; with
//! headroom but no bulk headroom it takes [`FlowQueue::pop_non_bulk`] (the next request in the order above that is not bulk),
//! so the others' and higher bands' requests find room at once and the flood waits in the
//! queue (and expires at the TTL) rather than in the engines. A tenant alone in the queue is
//! bulk too (when it holds two or more): the room it leaves is what the next tenant's arrival
//! finds. Measured in docs/decisions/flow-control.md.
//!
//! The flooding rule holds at the door too ([`FlowQueue::offer`]): with the queue empty and
//! the fleet with headroom, a flooding tenant's band-≤-0 request is dispatched only while there
//! is bulk headroom, else queued. Without it the flood, let through at once while the queue is
//! still empty, fills the pods to the KV threshold before the queue forms, and the others'
//! arrivals of that moment wait in the engines (docs/decisions/flow-control.md).
//!
//! The drivers also *dispatch by headroom*: a released request is routed only among the pods
//! with headroom for it ([`saturation::pod_headroom`] under its thresholds), so it can start
//! soon. The release rule itself (the room, which requests leave, the pods each must avoid)
//! is [`release`], run by both drivers.
//!
//! # Admission rules ([`FlowQueue::offer`])
//!
//! - flow control off, or the queue empty and the fleet with headroom (bulk headroom for a
//!   bulk request): dispatch now (the queue costs nothing while the fleet keeps up);
//! - no healthy pod: [`Rejection::Unavailable`] (503);
//! - must wait and sheddable (priority < 0): [`Rejection::Sheddable`] (429), shed first, never
//!   queued;
//! - the tenant already holds `tenant_max_share × max_queued_requests` places (at least 1):
//!   [`Rejection::TenantShare`] (429);
//! - the queue full (`max_queued_requests` entries or `max_queued_bytes` bytes): the newest
//!   entry of the lowest band below the request's, from that band's largest tenant, is evicted
//!   ([`Offer::Queued`]'s evicted, 429 `flow_evicted`) until it fits; if none is lower,
//!   [`Rejection::QueueFull`] (429);
//! - else queued, until `min(now + queue_ttl_ms, the request's deadline)`: past it,
//!   [`FlowQueue::expire`] returns it with [`Expiry::Ttl`] or [`Expiry::Deadline`].
//!
//! A request released from the queue is never lost: it leaves through exactly one of
//! [`FlowQueue::pop`], [`FlowQueue::expire`], [`FlowQueue::remove`] (the client went away) or an
//! eviction.
//!
//! # Parameters (defaults) — config table `[flow_control]`
//!
//! `enabled` **false** (off: today's behaviour); `max_queued_requests` **1024** (the gateway's
//! admission queue size); `max_queued_bytes` **256 MiB** of request bodies; `queue_ttl_ms`
//! **30,000** (llm-d's default request TTL); `tenant_max_share` **0.5**; `max_tenants` **64**;
//! `tenant_idle_ms` **300,000** (five minutes: a tenant's metric series stay continuous across
//! pauses shorter than a typical scrape-and-alert window); `bulk_window_ms` **10,000** (the
//! flooding rule's time constant; 0 turns the rule off, leaving only the bulk tenant of the
//! queue);
//! `saturation.bulk_queue_reserve` **4**; `saturation.bulk_kv_reserve` **0.3** (in
//! `[0, kv_cache_util_threshold)`; 0 turns bulk requests off); `forward_priority` **false** (write the priority into the body sent to vLLM: vLLM's default
//! `fcfs` scheduler refuses any non-zero `priority`, so only with `--scheduling-policy
//! priority`); `saturation`: see [`saturation`].
//!
//! # Bounds
//!
//! Entries ≤ `max_queued_requests`, their bytes ≤ `max_queued_bytes`; tenants ≤ one more than
//! `max_tenants` (each a name and five numbers); bands ≤ 33. `offer`, `pop`: O(log bands +
//! tenants); `expire`: O(entries) when an entry is due, else O(1); `remove`: O(entries of its
//! tenant in its band).

pub mod release;
pub mod saturation;

pub use release::{FleetRoom, PredictedTtft, Released, release};
pub use saturation::{Saturation, SaturationConfig, fleet_bulk_headroom, fleet_saturation};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Lowest priority band (more negative priorities join it).
pub const MIN_PRIORITY: i32 = -16;
/// Highest priority band.
pub const MAX_PRIORITY: i32 = 16;
/// The tenant every name beyond `max_tenants` shares.
pub const OTHER_TENANT: &str = "other";
/// The tenant of a request that names none (no API key, no tenant header).
pub const DEFAULT_TENANT: &str = "default";
/// Most tenants `max_tenants` may track.
pub const MAX_TENANTS_LIMIT: usize = 4096;

/// `[flow_control]`; see the module docs for every key and its default.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowConfig {
    pub enabled: bool,
    pub max_queued_requests: usize,
    pub max_queued_bytes: u64,
    pub queue_ttl_ms: u64,
    pub tenant_max_share: f64,
    pub max_tenants: usize,
    pub tenant_idle_ms: u64,
    pub bulk_window_ms: u64,
    pub forward_priority: bool,
    pub saturation: SaturationConfig,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            enabled: false,
            max_queued_requests: 1024,
            max_queued_bytes: 256 << 20,
            queue_ttl_ms: 30_000,
            tenant_max_share: 0.5,
            max_tenants: 64,
            tenant_idle_ms: 300_000,
            bulk_window_ms: 10_000,
            forward_priority: false,
            saturation: SaturationConfig::default(),
        }
    }
}

/// Why a [`FlowConfig`] is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlowConfigError {
    #[error("flow_control.{0} must be positive")]
    NotPositive(&'static str),
    #[error("flow_control.tenant_max_share must be in (0, 1], got {0}")]
    Share(f64),
    #[error("flow_control.saturation.kv_cache_util_threshold must be in (0, 1], got {0}")]
    KvThreshold(f64),
    #[error(
        "flow_control.saturation.bulk_kv_reserve must be in [0, kv_cache_util_threshold), got {0}"
    )]
    BulkReserve(f64),
    #[error("flow_control.max_tenants must be at most {MAX_TENANTS_LIMIT}, got {0}")]
    TooManyTenants(usize),
}

impl FlowConfig {
    pub fn validate(&self) -> Result<(), FlowConfigError> {
        if self.max_queued_requests == 0 {
            return Err(FlowConfigError::NotPositive("max_queued_requests"));
        }
        if self.max_queued_bytes == 0 {
            return Err(FlowConfigError::NotPositive("max_queued_bytes"));
        }
        if self.queue_ttl_ms == 0 {
            return Err(FlowConfigError::NotPositive("queue_ttl_ms"));
        }
        if self.max_tenants == 0 {
            return Err(FlowConfigError::NotPositive("max_tenants"));
        }
        if self.max_tenants > MAX_TENANTS_LIMIT {
            return Err(FlowConfigError::TooManyTenants(self.max_tenants));
        }
        if !(self.tenant_max_share > 0.0 && self.tenant_max_share <= 1.0) {
            return Err(FlowConfigError::Share(self.tenant_max_share));
        }
        let kv = self.saturation.kv_cache_util_threshold;
        if !(kv > 0.0 && kv <= 1.0) {
            return Err(FlowConfigError::KvThreshold(kv));
        }
        let r = self.saturation.bulk_kv_reserve;
        if !(r >= 0.0 && r < kv) {
            return Err(FlowConfigError::BulkReserve(r));
        }
        if self.saturation.queue_depth_threshold == 0 {
            return Err(FlowConfigError::NotPositive(
                "saturation.queue_depth_threshold",
            ));
        }
        Ok(())
    }

    /// Places one tenant may hold: `tenant_max_share × max_queued_requests`, at least 1.
    pub fn tenant_cap(&self) -> usize {
        ((self.tenant_max_share * self.max_queued_requests as f64).floor() as usize).max(1)
    }
}

/// A priority clamped into its band.
pub fn band_of(priority: i32) -> i32 {
    priority.clamp(MIN_PRIORITY, MAX_PRIORITY)
}

/// A tracked tenant (index into the queue's tenant table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(pub u32);

/// One queued request's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryId(pub u64);

/// What the driver knows of a request when it offers it.
#[derive(Debug, Clone, Copy)]
pub struct FlowRequest<'a> {
    pub priority: i32,
    pub tenant: &'a str,
    /// The work it asks for, in tokens (prompt + `max_tokens`): the fairness measure.
    pub cost_tokens: u64,
    /// Bytes it holds while queued (its body).
    pub bytes: u64,
    /// Its own deadline (request timeout from arrival), ms on the driver's clock.
    pub deadline_ms: f64,
}

/// Why a request was refused a place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No healthy pod (503).
    Unavailable,
    /// Sheddable (priority < 0) and the fleet is saturated (429).
    Sheddable,
    /// Its tenant holds its share of the queue (429).
    TenantShare,
    /// The queue is full of requests at least as important (429).
    QueueFull,
}

impl Rejection {
    /// The OpenAI-style error code.
    pub fn code(self) -> &'static str {
        match self {
            Rejection::Unavailable => "flow_unavailable",
            Rejection::Sheddable => "flow_shed",
            Rejection::TenantShare => "flow_tenant_share",
            Rejection::QueueFull => "flow_queue_full",
        }
    }

    /// The HTTP status: 503 when the fleet is unavailable, else 429 (the client's share).
    pub fn status(self) -> u16 {
        match self {
            Rejection::Unavailable => 503,
            _ => 429,
        }
    }
}

/// Why a queued request ran out of time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// `queue_ttl_ms` passed.
    Ttl,
    /// The request's own deadline came first.
    Deadline,
}

/// A request leaving the queue (released, expired, evicted or removed).
#[derive(Debug)]
pub struct Leaving<T> {
    pub id: EntryId,
    pub payload: T,
    pub band: i32,
    pub tenant: TenantId,
    /// Time it spent queued, ms.
    pub queued_ms: f64,
}

/// What [`FlowQueue::offer`] decided.
#[derive(Debug)]
pub enum Offer<T> {
    /// Dispatch now; the payload back.
    Dispatch(T),
    /// Queued; entries evicted to make room (answer them 429 `flow_evicted`).
    Queued(EntryId, Vec<Leaving<T>>),
    /// Refused; the payload back.
    Rejected(Rejection, T),
}

#[derive(Debug)]
struct Entry<T> {
    id: u64,
    payload: T,
    enqueued_ms: f64,
    expires_ms: f64,
    expiry: Expiry,
    bytes: u64,
    cost_tokens: u64,
}

#[derive(Debug)]
struct Tenant {
    name: String,
    /// Tokens released from the queue (see the module docs).
    attained: f64,
    queued: usize,
    /// When [`FlowQueue::tenant`] last looked it up.
    last_seen_ms: f64,
    /// Tokens it offered, decayed with time constant `bulk_window_ms`, as of `recent_at_ms`.
    recent_tokens: f64,
    recent_at_ms: f64,
}

/// The queue; see the module docs. `T` is the driver's handle of a waiting request.
#[derive(Debug)]
pub struct FlowQueue<T> {
    tenants: Vec<Tenant>,
    by_name: FxHashMap<String, TenantId>,
    /// Band → per-tenant FIFOs (indexed by tenant id, grown on demand).
    bands: BTreeMap<i32, Vec<VecDeque<Entry<T>>>>,
    /// Entry id → (band, tenant), for `remove`.
    where_is: FxHashMap<u64, (i32, TenantId)>,
    len: usize,
    bytes: u64,
    next_id: u64,
    virtual_time: f64,
    earliest_expiry_ms: f64,
    /// Names that lost their place to a newcomer, for the driver ([`Self::take_forgotten`]).
    forgotten: Vec<String>,
    /// Tokens offered by every tenant, decayed like [`Tenant::recent_tokens`].
    recent_tokens: f64,
    recent_at_ms: f64,
}

/// Most forgotten names kept for the driver between two [`FlowQueue::take_forgotten`] calls.
const MAX_FORGOTTEN: usize = 4096;

/// `value` counted at `at_ms`, decayed to `now_ms` with time constant `tau_ms`.
fn decayed(value: f64, at_ms: f64, now_ms: f64, tau_ms: f64) -> f64 {
    value * (-(now_ms - at_ms).max(0.0) / tau_ms).exp()
}

/// What the driver tells [`FlowQueue::offer`] of the fleet: its [`Saturation`] and its *bulk
/// headroom* ([`fleet_bulk_headroom`]: requests a bulk request may take now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub saturation: Saturation,
    pub bulk_headroom: u32,
}

impl From<Saturation> for Room {
    fn from(saturation: Saturation) -> Room {
        Room {
            saturation,
            bulk_headroom: saturation.headroom(),
        }
    }
}

impl<T> Default for FlowQueue<T> {
    fn default() -> Self {
        FlowQueue {
            tenants: Vec::new(),
            by_name: FxHashMap::default(),
            bands: BTreeMap::new(),
            where_is: FxHashMap::default(),
            len: 0,
            bytes: 0,
            next_id: 0,
            virtual_time: 0.0,
            earliest_expiry_ms: f64::INFINITY,
            forgotten: Vec::new(),
            recent_tokens: 0.0,
            recent_at_ms: 0.0,
        }
    }
}

impl<T> FlowQueue<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests queued.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Body bytes queued.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A tenant's name.
    pub fn tenant_name(&self, t: TenantId) -> &str {
        self.tenants
            .get(t.0 as usize)
            .map_or(OTHER_TENANT, |t| t.name.as_str())
    }

    /// Tokens a tenant was served from the queue.
    pub fn attained_tokens(&self, t: TenantId) -> f64 {
        self.tenants.get(t.0 as usize).map_or(0.0, |t| t.attained)
    }

    /// The tenant `name` is counted as at `now_ms`: tracked if there is room or an idle
    /// tenant's place to take (module docs), else [`OTHER_TENANT`].
    pub fn tenant(&mut self, cfg: &FlowConfig, name: &str, now_ms: f64) -> TenantId {
        if let Some(&id) = self.by_name.get(name) {
            self.seen(id, now_ms);
            return id;
        }
        let max = cfg.max_tenants.clamp(1, MAX_TENANTS_LIMIT);
        if self.tenants.len() >= max
            && let Some(id) = self.longest_idle(cfg, now_ms)
        {
            let t = &mut self.tenants[id.0 as usize];
            let old = std::mem::replace(&mut t.name, name.to_string());
            t.attained = self.virtual_time;
            t.last_seen_ms = now_ms;
            t.recent_tokens = 0.0;
            t.recent_at_ms = now_ms;
            self.by_name.remove(&old);
            self.by_name.insert(name.to_string(), id);
            if self.forgotten.len() < MAX_FORGOTTEN {
                self.forgotten.push(old);
            }
            return id;
        }
        let name = if self.tenants.len() < max {
            name
        } else {
            OTHER_TENANT
        };
        if let Some(&id) = self.by_name.get(name) {
            self.seen(id, now_ms);
            return id;
        }
        let id = TenantId(self.tenants.len() as u32);
        self.tenants.push(Tenant {
            name: name.to_string(),
            attained: self.virtual_time,
            queued: 0,
            last_seen_ms: now_ms,
            recent_tokens: 0.0,
            recent_at_ms: now_ms,
        });
        self.by_name.insert(name.to_string(), id);
        id
    }

    fn seen(&mut self, id: TenantId, now_ms: f64) {
        if let Some(t) = self.tenants.get_mut(id.0 as usize) {
            t.last_seen_ms = t.last_seen_ms.max(now_ms);
        }
    }

    /// The tracked tenant (not [`OTHER_TENANT`]) with nothing queued that was seen longest
    /// ago, if that is at least `tenant_idle_ms` before `now_ms`.
    fn longest_idle(&self, cfg: &FlowConfig, now_ms: f64) -> Option<TenantId> {
        let cutoff = now_ms - cfg.tenant_idle_ms as f64;
        self.tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| t.queued == 0 && t.last_seen_ms <= cutoff && t.name != OTHER_TENANT)
            .min_by(|(_, a), (_, b)| a.last_seen_ms.total_cmp(&b.last_seen_ms))
            .map(|(i, _)| TenantId(i as u32))
    }

    /// The names that lost their place to newcomers since the last call (at most 4,096; the
    /// driver drops their metric series).
    pub fn take_forgotten(&mut self) -> Vec<String> {
        std::mem::take(&mut self.forgotten)
    }

    /// Requests queued per (band, tenant), highest band first.
    pub fn queued_by_class(&self) -> Vec<(i32, TenantId, usize)> {
        let mut out = Vec::new();
        for (&band, queues) in self.bands.iter().rev() {
            for (t, q) in queues.iter().enumerate() {
                if !q.is_empty() {
                    out.push((band, TenantId(t as u32), q.len()));
                }
            }
        }
        out
    }

    /// Offers a request; see the module docs for the rules. `room` is the fleet's
    /// [`Saturation`] and its bulk headroom ([`Room`]; a plain [`Saturation`] converts with
    /// the bulk headroom equal to the headroom).
    pub fn offer(
        &mut self,
        cfg: &FlowConfig,
        req: FlowRequest<'_>,
        room: impl Into<Room>,
        now_ms: f64,
        payload: T,
    ) -> Offer<T> {
        if !cfg.enabled {
            return Offer::Dispatch(payload);
        }
        let room = room.into();
        if room.saturation == Saturation::Unavailable {
            return Offer::Rejected(Rejection::Unavailable, payload);
        }
        let band = band_of(req.priority);
        let tenant = self.tenant(cfg, req.tenant, now_ms);
        self.note_arrival(cfg, tenant, req.cost_tokens, now_ms);
        // A request that is not bulk queued behind waiting bulk requests is released by the
        // driver's next check with dispatch by headroom, which measured better than sending
        // it at once to any pod (docs/decisions/flow-control.md).
        if self.len == 0
            && room.saturation.headroom() > 0
            && (room.bulk_headroom > 0 || !self.is_bulk(cfg, tenant, band, now_ms))
        {
            return Offer::Dispatch(payload);
        }
        if band < 0 {
            return Offer::Rejected(Rejection::Sheddable, payload);
        }
        if self.tenants[tenant.0 as usize].queued >= cfg.tenant_cap() {
            return Offer::Rejected(Rejection::TenantShare, payload);
        }
        if req.bytes > cfg.max_queued_bytes {
            return Offer::Rejected(Rejection::QueueFull, payload);
        }
        let full = |len: usize, bytes: u64| {
            len >= cfg.max_queued_requests || bytes.saturating_add(req.bytes) > cfg.max_queued_bytes
        };
        if full(self.len, self.bytes) {
            // Room can only come from less important bands: refuse without evicting anyone
            // when even all of them would not make room.
            let (lower_len, lower_bytes) = self
                .bands
                .range(..band)
                .flat_map(|(_, qs)| qs.iter().flatten())
                .fold((0usize, 0u64), |(n, b), e| (n + 1, b + e.bytes));
            if full(self.len - lower_len, self.bytes.saturating_sub(lower_bytes)) {
                return Offer::Rejected(Rejection::QueueFull, payload);
            }
        }
        let mut evicted = Vec::new();
        while full(self.len, self.bytes) {
            match self.evict_below(band, now_ms) {
                Some(e) => evicted.push(e),
                None => break,
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let ttl_ms = now_ms + cfg.queue_ttl_ms as f64;
        let (expires_ms, expiry) = if req.deadline_ms < ttl_ms {
            (req.deadline_ms, Expiry::Deadline)
        } else {
            (ttl_ms, Expiry::Ttl)
        };
        let t = &mut self.tenants[tenant.0 as usize];
        if t.queued == 0 {
            t.attained = t.attained.max(self.virtual_time);
        }
        t.queued += 1;
        let queues = self.bands.entry(band).or_default();
        if queues.len() <= tenant.0 as usize {
            queues.resize_with(tenant.0 as usize + 1, VecDeque::new);
        }
        queues[tenant.0 as usize].push_back(Entry {
            id,
            payload,
            enqueued_ms: now_ms,
            expires_ms,
            expiry,
            bytes: req.bytes,
            cost_tokens: req.cost_tokens,
        });
        self.where_is.insert(id, (band, tenant));
        self.len += 1;
        self.bytes += req.bytes;
        self.earliest_expiry_ms = self.earliest_expiry_ms.min(expires_ms);
        Offer::Queued(EntryId(id), evicted)
    }

    /// The band and tenant [`Self::pop`] would take from next (highest band, least-served
    /// tenant, oldest), if any; entries in bands ≤ 0 of the tenants `skip` names are passed
    /// over.
    fn pick(&self, skip: impl Fn(usize) -> bool) -> Option<(i32, usize)> {
        let tenants = &self.tenants;
        self.bands.iter().rev().find_map(|(&band, queues)| {
            queues
                .iter()
                .enumerate()
                .filter(|(t, _)| band > 0 || !skip(*t))
                .filter_map(|(t, q)| q.front().map(|e| (t, e)))
                .min_by(|(ta, a), (tb, b)| {
                    tenants[*ta]
                        .attained
                        .total_cmp(&tenants[*tb].attained)
                        .then(a.enqueued_ms.total_cmp(&b.enqueued_ms))
                        .then(a.id.cmp(&b.id))
                })
                .map(|(t, _)| (band, t))
        })
    }

    /// The *bulk* tenant: the one holding more than half of the queued requests (at least
    /// two queued), if any (see the module docs).
    fn bulk_tenant(&self) -> Option<usize> {
        if self.len < 2 {
            return None;
        }
        self.tenants.iter().position(|t| t.queued * 2 > self.len)
    }

    /// Counts `tokens` offered by `tenant` at `now_ms` in the decayed arrival totals.
    fn note_arrival(&mut self, cfg: &FlowConfig, tenant: TenantId, tokens: u64, now_ms: f64) {
        let tau = cfg.bulk_window_ms as f64;
        if tau <= 0.0 {
            return;
        }
        let tokens = tokens as f64;
        self.recent_tokens = decayed(self.recent_tokens, self.recent_at_ms, now_ms, tau) + tokens;
        self.recent_at_ms = self.recent_at_ms.max(now_ms);
        if let Some(t) = self.tenants.get_mut(tenant.0 as usize) {
            t.recent_tokens = decayed(t.recent_tokens, t.recent_at_ms, now_ms, tau) + tokens;
            t.recent_at_ms = t.recent_at_ms.max(now_ms);
        }
    }

    /// Whether `tenant` is *flooding*: over the last `bulk_window_ms` (tokens offered,
    /// decayed), it sent more than twice what the other tenants seen in that window sent on
    /// average (so a lone tenant never floods). See the module docs.
    /// `seen` is [`Self::seen_in_window`] at `now_ms` (computed once per decision: O(1) here).
    fn flooding(&self, cfg: &FlowConfig, tenant: usize, now_ms: f64, seen: usize) -> bool {
        let tau = cfg.bulk_window_ms as f64;
        let Some(t) = self.tenants.get(tenant) else {
            return false;
        };
        if tau <= 0.0 || t.name == OTHER_TENANT {
            return false;
        }
        let since = now_ms - tau;
        let active = seen;
        let total = decayed(self.recent_tokens, self.recent_at_ms, now_ms, tau);
        let mine = decayed(t.recent_tokens, t.recent_at_ms, now_ms, tau);
        let others = active.saturating_sub(usize::from(t.last_seen_ms >= since));
        others > 0 && mine > 2.0 * (total - mine).max(0.0) / others as f64
    }

    /// Tenants seen within the last `bulk_window_ms` before `now_ms`.
    fn seen_in_window(&self, cfg: &FlowConfig, now_ms: f64) -> usize {
        let since = now_ms - cfg.bulk_window_ms as f64;
        self.tenants
            .iter()
            .filter(|t| t.last_seen_ms >= since)
            .count()
    }

    /// Whether a request of `band` from `tenant` is *bulk* at `now_ms`: band ≤ 0, from the
    /// tenant holding most of the queue or from a flooding tenant (module docs).
    pub fn is_bulk(&self, cfg: &FlowConfig, tenant: TenantId, band: i32, now_ms: f64) -> bool {
        let t = tenant.0 as usize;
        band <= 0
            && (self.bulk_tenant() == Some(t)
                || self.flooding(cfg, t, now_ms, self.seen_in_window(cfg, now_ms)))
    }

    /// Whether the request [`Self::pop`] would release next is *bulk* ([`Self::is_bulk`]).
    /// None when the queue is empty.
    pub fn next_is_bulk(&self, cfg: &FlowConfig, now_ms: f64) -> Option<bool> {
        let (band, tenant) = self.pick(|_| false)?;
        Some(self.is_bulk(cfg, TenantId(tenant as u32), band, now_ms))
    }

    /// The next request to dispatch (highest band, least-served tenant, oldest), if any.
    pub fn pop(&mut self, now_ms: f64) -> Option<Leaving<T>> {
        let pick = self.pick(|_| false)?;
        self.take(pick, now_ms)
    }

    /// [`Self::pop`] passing over bulk requests: the next request that is not bulk, if any
    /// (for when the fleet has headroom but no bulk headroom).
    pub fn pop_non_bulk(&mut self, cfg: &FlowConfig, now_ms: f64) -> Option<Leaving<T>> {
        let pick = self.pick_non_bulk(cfg, now_ms)?;
        self.take(pick, now_ms)
    }

    fn pick_non_bulk(&self, cfg: &FlowConfig, now_ms: f64) -> Option<(i32, usize)> {
        let bulk = self.bulk_tenant();
        let seen = self.seen_in_window(cfg, now_ms);
        self.pick(|t| bulk == Some(t) || self.flooding(cfg, t, now_ms, seen))
    }

    fn take(&mut self, (band, tenant): (i32, usize), now_ms: f64) -> Option<Leaving<T>> {
        let entry = self.bands.get_mut(&band)?.get_mut(tenant)?.pop_front()?;
        let t = &mut self.tenants[tenant];
        self.virtual_time = self.virtual_time.max(t.attained);
        t.attained += entry.cost_tokens as f64;
        Some(self.left(band, TenantId(tenant as u32), entry, now_ms))
    }

    /// Removes and returns every entry whose time ran out by `now_ms`.
    pub fn expire(&mut self, now_ms: f64) -> Vec<(Leaving<T>, Expiry)> {
        if now_ms < self.earliest_expiry_ms {
            return Vec::new();
        }
        let mut due = Vec::new();
        let mut earliest = f64::INFINITY;
        for (&band, queues) in self.bands.iter_mut() {
            for (t, q) in queues.iter_mut().enumerate() {
                let mut i = 0;
                while i < q.len() {
                    if q[i].expires_ms <= now_ms {
                        if let Some(e) = q.remove(i) {
                            due.push((band, TenantId(t as u32), e));
                        }
                    } else {
                        earliest = earliest.min(q[i].expires_ms);
                        i += 1;
                    }
                }
            }
        }
        self.earliest_expiry_ms = earliest;
        let out = due
            .into_iter()
            .map(|(band, tenant, e)| {
                let expiry = e.expiry;
                (self.left(band, tenant, e, now_ms), expiry)
            })
            .collect();
        self.bands.retain(|_, qs| qs.iter().any(|q| !q.is_empty()));
        out
    }

    /// Takes an entry out (its client went away); None if it already left.
    pub fn remove(&mut self, id: EntryId, now_ms: f64) -> Option<Leaving<T>> {
        let &(band, tenant) = self.where_is.get(&id.0)?;
        let q = self.bands.get_mut(&band)?.get_mut(tenant.0 as usize)?;
        let pos = q.iter().position(|e| e.id == id.0)?;
        let entry = q.remove(pos)?;
        Some(self.left(band, tenant, entry, now_ms))
    }

    /// The newest entry of the lowest band below `band`, from its largest tenant.
    fn evict_below(&mut self, band: i32, now_ms: f64) -> Option<Leaving<T>> {
        let (&low, queues) = self.bands.iter_mut().next()?;
        if low >= band {
            return None;
        }
        let (tenant, _) = queues
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.is_empty())
            .max_by_key(|(t, q)| (q.len(), std::cmp::Reverse(*t)))?;
        let entry = queues[tenant].pop_back()?;
        Some(self.left(low, TenantId(tenant as u32), entry, now_ms))
    }

    /// Bookkeeping of an entry taken out of its FIFO.
    fn left(&mut self, band: i32, tenant: TenantId, e: Entry<T>, now_ms: f64) -> Leaving<T> {
        self.len -= 1;
        self.bytes = self.bytes.saturating_sub(e.bytes);
        self.where_is.remove(&e.id);
        if let Some(t) = self.tenants.get_mut(tenant.0 as usize) {
            t.queued = t.queued.saturating_sub(1);
        }
        if self
            .bands
            .get(&band)
            .is_some_and(|qs| qs.iter().all(VecDeque::is_empty))
        {
            self.bands.remove(&band);
        }
        if self.len == 0 {
            self.earliest_expiry_ms = f64::INFINITY;
        }
        Leaving {
            id: EntryId(e.id),
            payload: e.payload,
            band,
            tenant,
            queued_ms: (now_ms - e.enqueued_ms).max(0.0),
        }
    }
}

#[cfg(test)]
mod tests;
