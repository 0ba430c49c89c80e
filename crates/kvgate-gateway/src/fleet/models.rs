//! `GET /v1/models`: the union, by model id, of every healthy pod's model list.
//!
//! Every healthy pod is asked at once (each at most [`MODELS_TIMEOUT`], its answer read up to
//! [`MAX_MODELS_BYTES`]); the answers are merged in pod-table order — a model's entry is the
//! first pod's that lists it, with one field added: `kvgate_pods`, the pods (as shown in logs
//! and `x-kvgate-pod`) that listed it, in pod-table order — then sorted by id. The merge is linear (a hash set of the ids
//! seen) and runs on a blocking thread (`spawn_blocking`), not on the async workers: a pod may
//! list tens of thousands of ids in its 1 MiB, and parsing, merging and serialising them takes
//! milliseconds that traffic and the admin listener must not wait for. (It used to be a
//! quadratic scan on a worker: two pods of 45,000 ids took 55 s a call and froze the runtime.)
//!
//! Bound: at most [`MAX_MODEL_IDS`] distinct ids are listed; the rest are dropped, logged at
//! warn (rate limited, see [`crate::log_limit`]). Entries without a string `id` are not models
//! (OpenAI's `Model` object requires one) and are dropped too.

use crate::errors::{no_healthy_pod, upstream_failed};
use crate::pods::Pod;
use crate::reject::reject;
use crate::request_id::request_id;
use crate::state::{Shared, UpstreamClient};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Per-pod timeout of the fan-out.
pub const MODELS_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest model list read from one pod.
pub const MAX_MODELS_BYTES: usize = 1 << 20;
/// Most distinct model ids listed. A vLLM pod lists its base model and its LoRA adapters
/// (`--max-loras`, `--max-cpu-loras`: tens, rarely hundreds); 10,000 is far above any fleet's
/// real list while it keeps the answer around 1 MiB and its merge under a few milliseconds.
pub const MAX_MODEL_IDS: usize = 10_000;

/// The merged list: the `{"object":"list","data":[…]}` body and how many distinct ids were
/// dropped over [`MAX_MODEL_IDS`].
#[derive(Debug, PartialEq)]
pub struct Merged {
    pub body: String,
    pub dropped_ids: usize,
}

/// Merges the pods' answers (each a pod's name and its `/v1/models` body; unparsable ones are
/// skipped), in order: the first entry of each id is kept, with `kvgate_pods` (every pod that
/// listed the id, once each), at most `max_ids` ids, then sorted by id. None when no answer is a
/// model list. Linear in the number of entries (one hash-map probe each).
pub fn merge(answers: &[(String, Bytes)], max_ids: usize) -> Option<Merged> {
    // Each id's place in `data` and `pods`.
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut data: Vec<Value> = Vec::new();
    let mut pods: Vec<Vec<String>> = Vec::new();
    let mut dropped: HashSet<String> = HashSet::new();
    let mut any_list = false;
    for (pod, answer) in answers {
        let Ok(mut v) = serde_json::from_slice::<Value>(answer) else {
            continue;
        };
        let Some(Value::Array(list)) = v.get_mut("data").map(Value::take) else {
            continue;
        };
        any_list = true;
        for m in list {
            let Some(id) = m.get("id").and_then(Value::as_str) else {
                continue;
            };
            if let Some(&i) = seen.get(id) {
                if let Some(p) = pods.get_mut(i)
                    && p.last() != Some(pod)
                {
                    p.push(pod.clone());
                }
                continue;
            }
            if seen.len() >= max_ids {
                // Counted once per distinct id, bounded like `seen`.
                if dropped.len() < max_ids && !dropped.contains(id) {
                    dropped.insert(id.to_string());
                }
                continue;
            }
            seen.insert(id.to_string(), data.len());
            data.push(m);
            pods.push(vec![pod.clone()]);
        }
    }
    if !any_list {
        return None;
    }
    for (m, p) in data.iter_mut().zip(pods) {
        if let Value::Object(fields) = m {
            fields.insert("kvgate_pods".into(), Value::from(p));
        }
    }
    fn id(v: &Value) -> &str {
        v.get("id").and_then(Value::as_str).unwrap_or("")
    }
    data.sort_unstable_by(|a, b| id(a).cmp(id(b)));
    let body = serde_json::json!({"object": "list", "data": data}).to_string();
    Some(Merged {
        body,
        dropped_ids: dropped.len(),
    })
}

/// `GET /v1/models`.
pub async fn models(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let rid = request_id(req.headers());
    let pods: Vec<Arc<Pod>> = shared
        .fleet
        .pods
        .all()
        .iter()
        .filter(|p| p.is_healthy())
        .cloned()
        .collect();
    if pods.is_empty() {
        return reject(&shared.telemetry, no_healthy_pod(), &rid);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, pod) in pods.into_iter().enumerate() {
        let shared = shared.clone();
        tasks.spawn(async move {
            let answer =
                tokio::time::timeout(MODELS_TIMEOUT, fetch_models(&shared.fleet.client, &pod))
                    .await
                    .ok()
                    .flatten();
            (i, answer.map(|body| (pod.url.clone(), body)))
        });
    }
    let mut answers: Vec<(usize, (String, Bytes))> = Vec::new();
    while let Some(res) = tasks.join_next().await {
        if let Ok((i, Some(body))) = res {
            answers.push((i, body));
        }
    }
    // Pod-table order, whichever answered first: the same request lists the same entries.
    answers.sort_unstable_by_key(|(i, _)| *i);
    let answers: Vec<(String, Bytes)> = answers.into_iter().map(|(_, b)| b).collect();
    let merged = tokio::task::spawn_blocking(move || merge(&answers, MAX_MODEL_IDS))
        .await
        .ok()
        .flatten();
    let Some(merged) = merged else {
        return reject(
            &shared.telemetry,
            upstream_failed("no pod answered /v1/models".into()),
            &rid,
        );
    };
    if merged.dropped_ids > 0 && shared.telemetry.log_limit.allow("models_truncated") {
        tracing::warn!(
            request_id = %rid,
            dropped_ids = merged.dropped_ids,
            max_ids = MAX_MODEL_IDS,
            "the pods list more model ids than /v1/models keeps; the rest are left out"
        );
    }
    let mut resp = Response::new(Body::from(merged.body));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// One pod's `/v1/models` body (2xx, at most [`MAX_MODELS_BYTES`]); parsed later, off the
/// async workers.
pub(crate) async fn fetch_models(client: &UpstreamClient, pod: &Pod) -> Option<Bytes> {
    let uri = pod.uri_for("/v1/models").ok()?;
    let req = http::Request::get(uri).body(Full::new(Bytes::new())).ok()?;
    let resp = client.request(req).await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    Some(
        Limited::new(resp.into_body(), MAX_MODELS_BYTES)
            .collect()
            .await
            .ok()?
            .to_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pod `owner`'s answer listing `ids`.
    fn list(ids: impl IntoIterator<Item = String>, owner: &str) -> (String, Bytes) {
        let data: Vec<Value> = ids
            .into_iter()
            .map(|id| serde_json::json!({"id": id, "p": owner}))
            .collect();
        let body = Bytes::from(serde_json::json!({"object": "list", "data": data}).to_string());
        (owner.to_string(), body)
    }

    fn ids_and_pods(m: &Merged) -> Vec<(String, Vec<String>)> {
        let v: Value = serde_json::from_str(&m.body).unwrap();
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let pods = m["kvgate_pods"].as_array().unwrap();
                let pods = pods.iter().map(|p| p.as_str().unwrap().to_string());
                (m["id"].as_str().unwrap().to_string(), pods.collect())
            })
            .collect()
    }

    fn ids_and_owners(m: &Merged) -> Vec<(String, String)> {
        let v: Value = serde_json::from_str(&m.body).unwrap();
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap().to_string(),
                    m["p"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn the_union_keeps_the_first_pods_entry_sorts_by_id_and_skips_bad_answers() {
        let a = list(["b".into(), "a".into()], "pod-a");
        let b = list(["c".into(), "a".into(), "b".into()], "pod-b");
        let junk = ("junk".to_string(), Bytes::from_static(b"not json"));
        let no_id = (
            "no-id".to_string(),
            Bytes::from_static(br#"{"data":[{"object":"model"},{"id":3}]}"#),
        );
        let m = merge(&[junk.clone(), a, no_id, b], 10).unwrap();
        assert_eq!(
            ids_and_owners(&m),
            [("a", "pod-a"), ("b", "pod-a"), ("c", "pod-b")]
                .map(|(i, o)| (i.to_string(), o.to_string()))
        );
        assert_eq!(m.dropped_ids, 0);
        let pods = |p: &[&str]| p.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ids_and_pods(&m),
            vec![
                ("a".to_string(), pods(&["pod-a", "pod-b"])),
                ("b".to_string(), pods(&["pod-a", "pod-b"])),
                ("c".to_string(), pods(&["pod-b"])),
            ]
        );
        assert_eq!(merge(&[junk], 10), None);
        assert_eq!(merge(&[], 10), None);
    }

    #[test]
    fn two_pods_of_45000_ids_merge_in_linear_time_and_keep_the_bound() {
        // Half of pod b's ids are pod a's, half its own.
        let a = list((0..45_000).map(|i| format!("{i:05}")), "a");
        let b = list((22_500..67_500).map(|i| format!("{i:05}")), "b");
        assert!(a.1.len() < MAX_MODELS_BYTES && b.1.len() < MAX_MODELS_BYTES);
        let started = std::time::Instant::now();
        let m = merge(&[a.clone(), b.clone()], 100_000).unwrap();
        let took = started.elapsed();
        let got = ids_and_owners(&m);
        let want: Vec<(String, String)> = (0..67_500)
            .map(|i| {
                let owner = if i < 45_000 { "a" } else { "b" };
                (format!("{i:05}"), owner.to_string())
            })
            .collect();
        assert_eq!(got, want);
        // A guard against the quadratic merge (tens of seconds), generous for a debug build.
        assert!(took < Duration::from_secs(5), "merge took {took:?}");

        // With the bound: the first MAX_MODEL_IDS ids seen (pod a's first ones), the rest
        // counted as dropped.
        let m = merge(&[a, b], MAX_MODEL_IDS).unwrap();
        let got = ids_and_owners(&m);
        assert_eq!(got.len(), MAX_MODEL_IDS);
        assert_eq!(got, want[..MAX_MODEL_IDS]);
        assert_eq!(m.dropped_ids, MAX_MODEL_IDS, "counted up to the bound");
    }
}
