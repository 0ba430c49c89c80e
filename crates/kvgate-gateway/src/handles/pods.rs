//! The pod table: every pod the gateway routes to, its scraped metrics and health. (The
//! router's in-flight counters are the core session's ledger, [`kvgate_core::RouterSession`].)
//!
//! Pods get dense [`PodId`]s (the smallest free id), because the prefix index and the
//! predictor key per-pod state by id. A pod removed by a config reload frees its id and its
//! index entries. The table is swapped whole ([`ArcSwap`]) on reload; the data path reads it
//! without locking. Bounds: one entry per configured pod (per engine of a data-parallel server:
//! `dp=N` is N entries, N ≤ [`MAX_DATA_PARALLEL_SIZE`]); ids < [`MAX_PODS`].
//!
//! Data-parallel servers (vLLM `--data-parallel-size N`): N pods `URL#dp<rank>` at one
//! connect URL, each routed, charged and trained on as a pod; the proxy pins a request to its
//! engine with `X-data-parallel-rank` ([`crate::upstream`]), the scrape reads the server once
//! for all of them ([`crate::scrape`]).
//!
//! Credentials: a pod URL may carry userinfo (`http://user:pass@host:port`). [`Pod::url`], the
//! form every log line, metric label, `/debug/*` page and `x-kvgate-pod` header shows, has it
//! redacted ([`redact_userinfo`]); only [`Pod::connect_url`] (the requests to the pod) and the
//! lookups by configured URL ([`PodTable::by_url`]) see the real one.
//!
//! Also here: what a scrape reads of a pod ([`PodMetrics`], parsed by [`crate::scrape`]), and each
//! pod's failure [`Breaker`] (its state; when it counts and what it avoids: [`crate::breaker`]).

use arc_swap::ArcSwap;
use kvgate_core::{
    AdapterId, AdapterSet, InFlight, LoraSlots, PodId, PodRole, PodSnapshot, ServedModels,
};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one scrape told us about a pod. `None`: the series was absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodMetrics {
    pub running: Option<u32>,
    pub waiting: Option<u32>,
    /// 0..=1.
    pub kv_usage: Option<f64>,
    pub block_size: Option<u32>,
    pub num_gpu_blocks: Option<u32>,
    /// The `model_name` label of `vllm:num_requests_running` (the engine index's chain seed).
    pub model_name: Option<String>,
    /// LoRA: the newest series of `vllm:lora_requests_info` (see [`LoraInfo`]).
    pub lora: Option<LoraInfo>,
    /// `vllm:num_requests_waiting_by_reason{reason="deferred"}`, summed over engines: requests
    /// waiting for a LoRA slot.
    pub deferred: Option<u32>,
    /// The engine's progress counters, summed: `vllm:prompt_tokens_total`,
    /// `vllm:generation_tokens_total`, `vllm:iteration_tokens_total_count` (and SGLang's
    /// `sglang:prompt_tokens_total`, `sglang:generation_tokens_total`); `None` when the pod
    /// exports none. Only whether it moved matters ([`crate::progress`]).
    pub engine_counters: Option<f64>,
    /// Lines that were neither comments, blank, nor a parseable sample.
    pub skipped_lines: u64,
}

/// The newest series of `vllm:lora_requests_info`: a gauge whose value is a timestamp and whose
/// old label sets linger, so the series with the highest value is the current one. Its
/// `waiting_lora_adapters` label is not read (vLLM 0.32 fills it with the running list).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraInfo {
    /// `max_lora`: adapter slots.
    pub max_loras: u32,
    /// `running_lora_adapters` (comma-separated names; ≤ `MAX_TRACKED_ADAPTERS` kept).
    pub running: AdapterSet,
    /// The series' value (its timestamp), to pick the newest.
    pub newest: f64,
}

/// Largest pod id the routed index accepts.
pub const MAX_PODS: usize = 65_536;

/// The metric label of a pod (its URL).
#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PodLabel {
    pub pod: String,
}

/// Most data-parallel engines one server may declare (`dp=N`): vLLM's DP size is a few to a
/// few dozen engines per server.
pub const MAX_DATA_PARALLEL_SIZE: u32 = 256;

/// A pod the table should hold: its base URL, predictor class, P/D role and data-parallel size
/// (from the config file, `--pod` or discovery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    pub url: String,
    pub class: String,
    pub role: PodRole,
    /// Engines behind the URL (vLLM `--data-parallel-size`): 1 is a plain pod; N > 1 makes
    /// the table hold N routable engines, one per rank, all at this URL.
    pub data_parallel_size: u32,
    /// The model the pod serves as configured (`model`), until its `/v1/models` is learnt
    /// ([`crate::served_models`]); `None`: not declared.
    pub model: Option<String>,
}

impl PodEntry {
    /// A `both` pod with one engine.
    pub fn new(url: impl Into<String>, class: impl Into<String>) -> Self {
        PodEntry {
            url: url.into(),
            class: class.into(),
            role: PodRole::Both,
            data_parallel_size: 1,
            model: None,
        }
    }

    /// Declares the model the pod serves (until its own list is learnt).
    pub fn with_model(mut self, model: Option<String>) -> Self {
        self.model = model.filter(|m| !m.is_empty());
        self
    }

    pub fn with_role(mut self, role: PodRole) -> Self {
        self.role = role;
        self
    }

    /// `n` data-parallel engines behind the URL (1: a plain pod).
    pub fn with_data_parallel_size(mut self, n: u32) -> Self {
        self.data_parallel_size = n.max(1);
        self
    }
}

/// One upstream pod.
#[derive(Debug)]
pub struct Pod {
    pub id: PodId,
    /// Base URL without a trailing slash as shown (logs, metric labels, `/debug/*`, response
    /// headers), e.g. `http://10.0.0.5:8000`; userinfo redacted (`http://***@10.0.0.5:8000`).
    pub url: String,
    /// The configured base URL without a trailing slash, userinfo included: what requests to
    /// the pod are sent to. Never logged.
    connect_url: String,
    /// `url` shared with every snapshot, so a decision copies a pointer, not the string.
    name: Arc<str>,
    /// The configured class (hardware profile).
    pub class: Arc<str>,
    /// What it serves in a P/D fleet (`both` unless configured).
    pub role: PodRole,
    /// Its data-parallel rank when it is one engine of a server with `dp=N` (N > 1): requests
    /// to it carry `X-data-parallel-rank`, its metrics are the series with `engine="rank"`,
    /// its KV events come from the rank's own endpoint. `None`: a plain pod.
    pub rank: Option<u32>,
    /// The server's data-parallel size (1 for a plain pod).
    pub data_parallel_size: u32,
    /// False after a failed scrape or connection error; true again after a successful scrape.
    /// Set false through [`Pod::mark_unhealthy`], which counts the outage.
    pub healthy: AtomicBool,
    /// Times the pod went from healthy to unhealthy: the KV-event task resubscribes after one,
    /// however short (the engine behind the pod may be new).
    outages: AtomicU64,
    /// Scrapes in a row that timed out (see `scrape::SCRAPE_TIMEOUTS_TO_UNHEALTHY`).
    pub scrape_timeouts_in_a_row: std::sync::atomic::AtomicU32,
    /// Responses dying mid-body: the pod is avoided for a cooldown even while it scrapes fine.
    pub breaker: Breaker,
    /// Whether its engine steps: a silence is a busy pod's, not a hung one's, while it does.
    pub progress: crate::progress::Progress,
    /// Set when a reload removed the pod; its scrape loop stops.
    pub removed: AtomicBool,
    /// The pod's series that every request updates, created at its first request
    /// (`Metrics::pod_series`), so that the proxy's path builds no label.
    pub series: OnceLock<PodSeries>,
    /// When the last KV-event batch of the pod was applied, ms since the Unix epoch (0: none
    /// yet); `kvgate_kv_events_last_batch_age_seconds`.
    pub last_kv_batch_unix_ms: AtomicU64,
    scraped: Mutex<Scraped>,
    /// The models it serves: declared, then learnt ([`crate::served_models`]).
    models: Mutex<PodModels>,
}

/// A pod's model lists; the learnt one, once there, is the one in force.
#[derive(Debug, Default)]
struct PodModels {
    declared: Option<Arc<ServedModels>>,
    declared_name: Option<String>,
    learnt: Option<Arc<ServedModels>>,
}

/// Handles to one pod's per-request series (the registry's own series, shared; see
/// `crate::metrics::Metrics::pod_series`).
#[derive(Debug, Clone)]
pub struct PodSeries {
    /// `kvgate_pod_ttft_ms{pod}`: first token after this attempt's dispatch, ms (streams).
    pub ttft_ms: prometheus_client::metrics::histogram::Histogram,
    /// `kvgate_pod_tpot_ms{pod}`.
    pub tpot_ms: prometheus_client::metrics::histogram::Histogram,
    /// `kvgate_pod_prompt_tokens_total{pod}`: prompt tokens of the requests routed to it.
    pub prompt_tokens: prometheus_client::metrics::counter::Counter,
    /// `kvgate_pod_cached_prompt_tokens_total{pod}`: of those, tokens the router's index
    /// held on the pod (prompt − charged prefill).
    pub cached_prompt_tokens: prometheus_client::metrics::counter::Counter,
}

/// What a snapshot reads, under one lock: the scraped load and the predictor's class.
#[derive(Debug, Clone, Default)]
struct Scraped {
    /// The predictor's class: `class@base_model` once the pod's base model is known (declared
    /// or learnt), else `class` ([`kvgate_core::predictor_class`]).
    predictor_class: Arc<str>,
    running: u32,
    waiting: u32,
    kv_usage: f64,
    kv_blocks: u32,
    block_size: Option<u32>,
    /// LoRA slots from the last scrape that reported `vllm:lora_requests_info`.
    lora: Option<LoraSlots>,
}

impl Pod {
    pub fn new(id: PodId, url: &str, class: &str, default_kv_blocks: u32) -> Self {
        let connect_url = url.trim_end_matches('/').to_string();
        Pod {
            id,
            url: redact_userinfo(&connect_url),
            name: redact_userinfo(&connect_url).into(),
            connect_url,
            class: class.into(),
            role: PodRole::Both,
            rank: None,
            data_parallel_size: 1,
            healthy: AtomicBool::new(false),
            outages: AtomicU64::new(0),
            scrape_timeouts_in_a_row: std::sync::atomic::AtomicU32::new(0),
            breaker: Breaker::default(),
            progress: crate::progress::Progress::new(),
            removed: AtomicBool::new(false),
            series: OnceLock::new(),
            last_kv_batch_unix_ms: AtomicU64::new(0),
            scraped: Mutex::new(Scraped {
                predictor_class: class.into(),
                kv_blocks: default_kv_blocks,
                ..Scraped::default()
            }),
            models: Mutex::new(PodModels::default()),
        }
    }

    /// The models the pod serves: its learnt list, else its declared one; `None` when neither
    /// is known (it is then taken to serve anything, see [`kvgate_core::models`]).
    pub fn served_models(&self) -> Option<Arc<ServedModels>> {
        let m = self.models.lock();
        m.learnt.clone().or_else(|| m.declared.clone())
    }

    /// Declares the pod's model (`None`: none declared); a learnt list still wins.
    pub fn declare_model(&self, model: Option<&str>) {
        let mut m = self.models.lock();
        if m.declared_name.as_deref() == model {
            return;
        }
        m.declared_name = model.map(str::to_string);
        m.declared = model.map(|n| Arc::new(ServedModels::declared(n)));
        self.set_predictor_class(&m);
    }

    /// The class the predictor learns this pod under (see the field).
    pub fn predictor_class(&self) -> Arc<str> {
        self.scraped.lock().predictor_class.clone()
    }

    fn set_predictor_class(&self, m: &PodModels) {
        let base = m
            .learnt
            .as_deref()
            .or(m.declared.as_deref())
            .and_then(ServedModels::base);
        let class = kvgate_core::predictor_class(&self.class, base);
        let mut scraped = self.scraped.lock();
        if *scraped.predictor_class != *class {
            scraped.predictor_class = class;
        }
    }

    /// Records the list read from the pod's `/v1/models`; true when it differs from the one
    /// in force before.
    pub fn learn_models(&self, learnt: ServedModels) -> bool {
        let mut m = self.models.lock();
        let before = m.learnt.as_deref().or(m.declared.as_deref());
        let changed = before != Some(&learnt);
        if m.learnt.as_deref() != Some(&learnt) {
            m.learnt = Some(Arc::new(learnt));
        }
        self.set_predictor_class(&m);
        changed
    }

    /// Engine `rank` of the data-parallel server at `url` with `size` engines: shown as
    /// `url#dp<rank>` (logs, metric labels, `/debug/*`, `x-kvgate-pod`), connecting to `url`.
    pub fn data_parallel_rank(
        id: PodId,
        url: &str,
        class: &str,
        default_kv_blocks: u32,
        rank: u32,
        size: u32,
    ) -> Self {
        let mut pod = Pod::new(id, url, class, default_kv_blocks);
        pod.url = format!("{}#dp{rank}", pod.url);
        pod.name = pod.url.as_str().into();
        pod.rank = Some(rank);
        pod.data_parallel_size = size;
        pod
    }

    pub fn label(&self) -> PodLabel {
        PodLabel {
            pod: self.url.clone(),
        }
    }

    /// Marks the pod unhealthy; true (and the outage counted) when it was healthy.
    pub fn mark_unhealthy(&self) -> bool {
        let was = self.healthy.swap(false, Ordering::Relaxed);
        if was {
            self.outages.fetch_add(1, Ordering::Relaxed);
        }
        was
    }

    /// Healthy-to-unhealthy transitions so far.
    pub fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }

    /// Scraped fine, no connection error since, and not in a failure cooldown.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed) && !self.breaker.is_open(std::time::Instant::now())
    }

    /// The configured base URL (userinfo included): for connecting and for matching the
    /// configuration, never for showing.
    pub fn connect_url(&self) -> &str {
        &self.connect_url
    }

    /// `base url + path_and_query` as a URI (the real URL, userinfo included).
    pub fn uri_for(&self, path_and_query: &str) -> Result<http::Uri, http::uri::InvalidUri> {
        let mut s = String::with_capacity(self.connect_url.len() + path_and_query.len());
        s.push_str(&self.connect_url);
        s.push_str(path_and_query);
        s.parse()
    }

    pub fn apply_metrics(&self, m: &PodMetrics) {
        let mut s = self.scraped.lock();
        if let Some(v) = m.running {
            s.running = v;
        }
        if let Some(v) = m.waiting {
            s.waiting = v;
        }
        if let Some(v) = m.kv_usage {
            s.kv_usage = v;
        }
        if m.block_size.is_some() {
            s.block_size = m.block_size;
        }
        if let Some(info) = m.lora {
            let base_model = m
                .model_name
                .as_deref()
                .map(AdapterId::of)
                .or(s.lora.and_then(|l| l.base_model));
            s.lora = Some(LoraSlots {
                max_loras: info.max_loras,
                base_model,
                running: info.running,
                deferred: m.deferred.unwrap_or(0),
                ..LoraSlots::default()
            });
        }
    }

    /// `block_size` of the pod's `vllm:cache_config_info`, once scraped.
    pub fn block_size_tokens(&self) -> Option<u32> {
        self.scraped.lock().block_size
    }

    /// Records the pod's KV size; true when it changed (the index must be resized).
    pub fn apply_capacity(&self, kv_blocks: u32) -> bool {
        let mut s = self.scraped.lock();
        let changed = s.kv_blocks != kv_blocks;
        s.kv_blocks = kv_blocks;
        changed
    }

    /// The pod as scraped; `in_flight` is left at zero for the session to fill.
    pub fn snapshot(&self) -> PodSnapshot {
        let s = self.scraped.lock();
        PodSnapshot {
            id: self.id,
            name: self.name.clone(),
            class: s.predictor_class.clone(),
            waiting: s.waiting,
            running: s.running,
            kv_usage: s.kv_usage,
            kv_blocks: s.kv_blocks,
            block_size_tokens: s.block_size,
            in_flight: InFlight::default(),
            healthy: self.is_healthy(),
            role: self.role,
            lora: s.lora,
        }
    }
}

/// All pods, swapped whole on reload.
#[derive(Debug, Default)]
pub struct PodTable {
    pods: ArcSwap<Fleet>,
}

/// The pod table at one moment: the pods in table order (a slice, by `Deref`) and each id's
/// place among them, so that a decision's chosen id gives back its pod's handle in O(1)
/// ([`Fleet::get`]). Bounds: one `u32` per id up to the highest in use (< 65,536).
#[derive(Debug, Default)]
pub struct Fleet {
    pods: Vec<Arc<Pod>>,
    /// `places[id]`: the pod's index in `pods`; [`NO_PLACE`] for an id not in use.
    places: Vec<u32>,
}

const NO_PLACE: u32 = u32::MAX;

impl Fleet {
    fn new(pods: Vec<Arc<Pod>>) -> Fleet {
        let len = pods.iter().map(|p| p.id.index() + 1).max().unwrap_or(0);
        let mut places = vec![NO_PLACE; len];
        for (i, p) in pods.iter().enumerate() {
            places[p.id.index()] = i as u32;
        }
        Fleet { pods, places }
    }

    /// The place of pod `id` in the table order (and in snapshots taken in it).
    pub fn place(&self, id: PodId) -> Option<usize> {
        match self.places.get(id.index()) {
            Some(&p) if p != NO_PLACE => Some(p as usize),
            _ => None,
        }
    }

    /// Pod `id`'s handle.
    pub fn get(&self, id: PodId) -> Option<&Arc<Pod>> {
        self.place(id).and_then(|i| self.pods.get(i))
    }
}

impl std::ops::Deref for Fleet {
    type Target = [Arc<Pod>];

    fn deref(&self) -> &[Arc<Pod>] {
        &self.pods
    }
}

/// What a [`PodTable::replace`] changed.
#[derive(Debug, Default)]
pub struct PodChanges {
    pub added: Vec<Arc<Pod>>,
    pub removed: Vec<Arc<Pod>>,
}

impl PodTable {
    pub fn all(&self) -> arc_swap::Guard<Arc<Fleet>> {
        self.pods.load()
    }

    pub fn by_url(&self, url: &str) -> Option<Arc<Pod>> {
        let url = url.trim_end_matches('/');
        self.pods
            .load()
            .iter()
            .find(|p| p.connect_url == url)
            .cloned()
    }

    pub fn snapshots(&self) -> Vec<PodSnapshot> {
        self.pods.load().iter().map(|p| p.snapshot()).collect()
    }

    /// Makes the table hold exactly `wanted` pods: keeps pods whose URL, class, role and
    /// data-parallel size are unchanged (with their state), adds new ones with the smallest
    /// free ids, and marks the rest removed (a pod whose role or DP size changed is a new pod).
    /// An entry with `data_parallel_size` N > 1 is N pods, ranks 0..N, at one URL. Pods beyond
    /// [`MAX_PODS`] are ignored.
    pub fn replace(&self, wanted: &[PodEntry], default_kv_blocks: u32) -> PodChanges {
        let old = self.pods.load_full();
        let mut changes = PodChanges::default();
        let mut next: Vec<Arc<Pod>> = Vec::with_capacity(wanted.len());
        let mut used = vec![false; MAX_PODS];
        // One engine per (entry, rank); the first entry naming a URL wins.
        let mut engines: Vec<(&PodEntry, Option<u32>)> = Vec::with_capacity(wanted.len());
        let mut urls: Vec<&str> = Vec::with_capacity(wanted.len());
        for w in wanted {
            let url = w.url.trim_end_matches('/');
            if urls.contains(&url) {
                continue;
            }
            urls.push(url);
            match w.data_parallel_size.min(MAX_DATA_PARALLEL_SIZE) {
                0 | 1 => engines.push((w, None)),
                n => engines.extend((0..n).map(|r| (w, Some(r)))),
            }
        }
        let same = |p: &Pod, w: &PodEntry, rank: Option<u32>| {
            p.connect_url == w.url.trim_end_matches('/')
                && p.rank == rank
                && *p.class == *w.class
                && p.role == w.role
                && p.data_parallel_size == w.data_parallel_size.max(1)
        };
        let mut kept: Vec<Option<Arc<Pod>>> = Vec::with_capacity(engines.len());
        for &(w, rank) in &engines {
            let found = old.iter().find(|p| same(p, w, rank)).cloned();
            if let Some(p) = &found {
                used[p.id.index()] = true;
            }
            kept.push(found);
        }
        for (&(w, rank), found) in engines.iter().zip(kept) {
            if let Some(p) = found {
                p.declare_model(w.model.as_deref());
                next.push(p);
                continue;
            }
            let url = w.url.trim_end_matches('/');
            let Some(free) = used.iter().position(|u| !u) else {
                tracing::warn!(url = %redact_userinfo(url), "pod table full; pod ignored");
                continue;
            };
            used[free] = true;
            let id = PodId(free as u32);
            let mut pod = match rank {
                None => Pod::new(id, url, &w.class, default_kv_blocks),
                Some(r) => Pod::data_parallel_rank(
                    id,
                    url,
                    &w.class,
                    default_kv_blocks,
                    r,
                    w.data_parallel_size,
                ),
            };
            pod.role = w.role;
            pod.declare_model(w.model.as_deref());
            let pod = Arc::new(pod);
            changes.added.push(pod.clone());
            next.push(pod);
        }
        for p in old.iter() {
            if !next.iter().any(|n| Arc::ptr_eq(n, p)) {
                p.removed.store(true, Ordering::Release);
                p.healthy.store(false, Ordering::Relaxed);
                changes.removed.push(p.clone());
            }
        }
        self.pods.store(Arc::new(Fleet::new(next)));
        changes
    }

    /// The engines of the data-parallel server at `pod`'s URL, in rank order (just `pod` for a
    /// plain pod).
    pub fn ranks_of(&self, pod: &Pod) -> Vec<Arc<Pod>> {
        let mut ranks: Vec<Arc<Pod>> = self
            .pods
            .load()
            .iter()
            .filter(|p| p.connect_url == pod.connect_url && p.rank.is_some() == pod.rank.is_some())
            .cloned()
            .collect();
        ranks.sort_by_key(|p| p.rank);
        ranks
    }
}

/// `url` with its userinfo (`user:pass@`) replaced by `***@`, for showing: `http://u:p@h:8000/x`
/// → `http://***@h:8000/x`. A URL without userinfo comes back unchanged. Only the authority (up
/// to the first `/`, `?` or `#` after `scheme://`) is searched, so an `@` in a path stays.
pub fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_len].rfind('@') {
        Some(at) => format!("{}***{}", &url[..scheme_end], &rest[at..]),
        None => url.to_string(),
    }
}

// Each pod's failure breaker (when it counts and what it avoids: `crate::breaker`).

/// The breaker's clock: nanoseconds since [`crate::progress::base`].
fn nanos(at: Instant) -> u64 {
    u64::try_from(
        at.saturating_duration_since(crate::progress::base())
            .as_nanos(),
    )
    .unwrap_or(u64::MAX)
}

/// One pod's breaker.
#[derive(Debug, Default)]
pub struct Breaker {
    /// Failures in a row (saturating).
    failures: AtomicU32,
    /// Avoided until this time (nanoseconds since [`base`]); 0: not avoided.
    open_until: AtomicU64,
}

/// What [`Breaker::failure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trip {
    /// Below the threshold.
    Counted(u32),
    /// The breaker opened: the pod is avoided until the cooldown ends.
    Opened(u32),
    /// At or past the threshold, but the breaker may not avoid another pod now: the pod stays
    /// routable (the next failure asks again).
    Withheld(u32),
}

impl Breaker {
    /// A response ended normally: the count goes back to 0.
    pub fn success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }

    /// A response died mid-body at `now`; `may_open`: whether the breaker may avoid this pod
    /// (the share of pods avoided at once is bounded).
    pub fn failure(
        &self,
        now: Instant,
        threshold: u32,
        cooldown: Duration,
        may_open: bool,
    ) -> Trip {
        let n = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if n == u32::MAX {
            self.failures.store(threshold, Ordering::Relaxed);
        }
        if n < threshold.max(1) {
            return Trip::Counted(n);
        }
        if !may_open {
            return Trip::Withheld(n);
        }
        let until = nanos(now + cooldown).max(1);
        self.open_until.store(until, Ordering::Relaxed);
        Trip::Opened(n)
    }

    /// Whether the pod is avoided at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        let until = self.open_until.load(Ordering::Relaxed);
        until != 0 && nanos(now) < until
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_redacted_from_the_shown_url_and_kept_for_connecting() {
        assert_eq!(
            redact_userinfo("http://user:s3cret@10.0.0.5:8000"),
            "http://***@10.0.0.5:8000"
        );
        assert_eq!(
            redact_userinfo("https://tok@h/v1?a=b@c"),
            "https://***@h/v1?a=b@c"
        );
        assert_eq!(redact_userinfo("http://a:b@c@h:1/p"), "http://***@h:1/p");
        assert_eq!(redact_userinfo("http://h:1/p@q"), "http://h:1/p@q");
        assert_eq!(redact_userinfo("not a url @x"), "not a url @x");
        let pod = Pod::new(PodId(0), "http://user:s3cret@127.0.0.1:9/", "x", 10);
        assert_eq!(pod.url, "http://***@127.0.0.1:9");
        assert_eq!(pod.label().pod, "http://***@127.0.0.1:9");
        assert_eq!(&*pod.snapshot().name, "http://***@127.0.0.1:9");
        assert_eq!(pod.connect_url(), "http://user:s3cret@127.0.0.1:9");
        assert_eq!(
            pod.uri_for("/metrics").unwrap().to_string(),
            "http://user:s3cret@127.0.0.1:9/metrics"
        );
        let t = PodTable::default();
        t.replace(&[PodEntry::new("http://user:s3cret@127.0.0.1:9", "x")], 10);
        assert_eq!(
            t.by_url("http://user:s3cret@127.0.0.1:9/").map(|p| p.id),
            Some(PodId(0))
        );
    }

    #[test]
    fn replace_keeps_pods_and_reuses_the_smallest_free_id() {
        let t = PodTable::default();
        let c = |u: &str| PodEntry::new(u, "x");
        let ch = t.replace(&[c("http://a"), c("http://b"), c("http://c")], 10);
        assert_eq!(ch.added.len(), 3);
        let ch = t.replace(&[c("http://a"), c("http://c"), c("http://d/")], 10);
        assert_eq!(ch.removed.len(), 1);
        assert_eq!(ch.removed[0].url, "http://b");
        assert!(ch.removed[0].removed.load(Ordering::Relaxed));
        assert_eq!(t.by_url("http://d").map(|p| p.id), Some(PodId(1)));
        assert_eq!(t.by_url("http://c").map(|p| p.id), Some(PodId(2)));
    }

    #[test]
    fn a_pods_handle_is_found_by_id_at_its_place_in_the_table_order() {
        let t = PodTable::default();
        let c = |u: &str| PodEntry::new(u, "x");
        t.replace(&[c("http://a"), c("http://b"), c("http://c")], 10);
        // b leaves, d takes its id 1 but comes last in the table order.
        t.replace(&[c("http://a"), c("http://c"), c("http://d")], 10);
        let fleet = t.all();
        let urls: Vec<&str> = fleet.iter().map(|p| p.url.as_str()).collect();
        assert_eq!(urls, ["http://a", "http://c", "http://d"]);
        assert_eq!(fleet.place(PodId(1)), Some(2));
        assert_eq!(
            fleet.get(PodId(1)).map(|p| p.url.as_str()),
            Some("http://d")
        );
        assert_eq!(
            fleet.get(PodId(2)).map(|p| p.url.as_str()),
            Some("http://c")
        );
        assert!(fleet.get(PodId(3)).is_none());
        assert!(fleet.get(PodId(60_000)).is_none());
    }

    #[test]
    fn a_pods_role_reaches_its_snapshot_and_a_role_change_makes_it_a_new_pod() {
        let t = PodTable::default();
        t.replace(
            &[PodEntry::new("http://a", "x").with_role(PodRole::Prefill)],
            10,
        );
        let a = t.by_url("http://a").unwrap();
        assert_eq!(a.snapshot().role, PodRole::Prefill);
        let ch = t.replace(
            &[PodEntry::new("http://a", "x").with_role(PodRole::Decode)],
            10,
        );
        assert_eq!((ch.added.len(), ch.removed.len()), (1, 1));
        assert_eq!(t.by_url("http://a").unwrap().role, PodRole::Decode);
    }

    #[test]
    fn a_data_parallel_server_is_one_pod_per_rank_at_one_url() {
        let t = PodTable::default();
        let dp = PodEntry::new("http://u:p@h:8000/", "x").with_data_parallel_size(2);
        let ch = t.replace(&[PodEntry::new("http://a", "x"), dp.clone()], 10);
        assert_eq!(ch.added.len(), 3);
        let pods = t.all();
        let shown: Vec<(&str, Option<u32>)> =
            pods.iter().map(|p| (p.url.as_str(), p.rank)).collect();
        assert_eq!(
            shown,
            [
                ("http://a", None),
                ("http://***@h:8000#dp0", Some(0)),
                ("http://***@h:8000#dp1", Some(1))
            ]
        );
        // Snapshots (what decisions, `/debug/*` and the core see) name each engine too.
        let names: Vec<String> = pods.iter().map(|p| p.snapshot().name.to_string()).collect();
        assert_eq!(
            names,
            ["http://a", "http://***@h:8000#dp0", "http://***@h:8000#dp1"]
        );
        assert!(
            pods.iter()
                .skip(1)
                .all(|p| p.connect_url() == "http://u:p@h:8000")
        );
        assert_eq!(
            pods[2].uri_for("/metrics").unwrap().to_string(),
            "http://u:p@h:8000/metrics"
        );
        let ranks: Vec<Option<u32>> = t.ranks_of(&pods[2]).iter().map(|p| p.rank).collect();
        assert_eq!(ranks, [Some(0), Some(1)]);
        assert_eq!(
            t.ranks_of(&pods[0]).len(),
            1,
            "a plain pod is its own group"
        );
        // Unchanged: kept with their ids; a new size: new engines.
        let ch = t.replace(&[PodEntry::new("http://a", "x"), dp], 10);
        assert_eq!((ch.added.len(), ch.removed.len()), (0, 0));
        let ch = t.replace(
            &[PodEntry::new("http://h:8000", "x").with_data_parallel_size(3)],
            10,
        );
        assert_eq!((ch.added.len(), ch.removed.len()), (3, 3));
        let ids: Vec<u32> = t.all().iter().map(|p| p.id.0).collect();
        assert_eq!(ids, [0, 1, 2], "freed ids are reused");
    }
}
