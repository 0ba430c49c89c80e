//! Per-model figures of a mixed-fleet run ([`ModelMetrics`] in `RunMetrics::models`).
//!
//! Memory: one TTFT (8 bytes) per completed request, as the run's own recorder keeps.

use super::ModelFleet;
use crate::engine::EngineMetrics;
use crate::report::{ModelMetrics, Percentiles};

/// Collects each model's completions during a run.
#[derive(Debug)]
pub struct ModelRecorder {
    ttft_ms: Vec<Vec<f64>>,
    /// Completions on a pod that serves another model (0 unless routing broke the rule).
    served_by_other_model: Vec<u64>,
}

impl ModelRecorder {
    pub fn new(fleet: &ModelFleet) -> Self {
        ModelRecorder {
            ttft_ms: vec![Vec::new(); fleet.models().len()],
            served_by_other_model: vec![0; fleet.models().len()],
        }
    }

    /// Request `id` of `fleet` completed on `pod` with this TTFT.
    pub fn completed(&mut self, fleet: &ModelFleet, id: u64, pod: usize, ttft_ms: f64) {
        let model = fleet.request_model(id);
        if let Some(t) = self.ttft_ms.get_mut(model) {
            t.push(ttft_ms);
        }
        if fleet.pod_model(pod) != Some(model)
            && let Some(n) = self.served_by_other_model.get_mut(model)
        {
            *n += 1;
        }
    }

    /// Each model's figures; `engines` in pod order gives each model's prefix-cache hit rate.
    pub fn finish(self, fleet: &ModelFleet, engines: &[EngineMetrics]) -> Vec<ModelMetrics> {
        let requests = fleet.requests_per_model();
        fleet
            .models()
            .iter()
            .zip(self.ttft_ms)
            .zip(self.served_by_other_model)
            .enumerate()
            .map(|(i, ((m, mut ttft), other))| {
                let (hits, queries) = engines
                    .iter()
                    .enumerate()
                    .filter(|(pod, _)| fleet.pod_model(*pod) == Some(i))
                    .fold((0u64, 0u64), |(h, q), (_, e)| {
                        (
                            h + e.prefix_cache_hits_tokens,
                            q + e.prefix_cache_queries_tokens,
                        )
                    });
                ModelMetrics {
                    model: m.name.clone(),
                    pods: m.pods,
                    profile: m.profile.name.to_string(),
                    requests: requests.get(i).copied().unwrap_or(0),
                    completed: ttft.len() as u64,
                    ttft_ms: Percentiles::of(&mut ttft),
                    prefix_hit_rate: if queries > 0 {
                        hits as f64 / queries as f64
                    } else {
                        0.0
                    },
                    served_by_other_model: other,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::FleetModel;
    use crate::profiles::Profile;

    #[test]
    fn completions_count_per_model_and_a_pod_of_another_model_is_flagged() {
        let mut fleet = ModelFleet::new(
            ["a", "b"]
                .iter()
                .map(|n| FleetModel {
                    name: (*n).into(),
                    pods: 1,
                    profile: Profile::default_profile(),
                    share: None,
                })
                .collect(),
        )
        .unwrap();
        fleet.set_request_models(vec![0, 1, 1]);
        let mut r = ModelRecorder::new(&fleet);
        r.completed(&fleet, 0, 0, 10.0);
        r.completed(&fleet, 1, 1, 30.0);
        r.completed(&fleet, 2, 0, 50.0); // b's request on a's pod
        let m = r.finish(&fleet, &[]);
        assert_eq!(
            (m[0].model.as_str(), m[0].requests, m[0].completed),
            ("a", 1, 1)
        );
        assert_eq!(m[0].ttft_ms.mean, 10.0);
        assert_eq!((m[1].requests, m[1].completed), (2, 2));
        assert_eq!((m[1].ttft_ms.mean, m[1].ttft_ms.p99), (40.0, 50.0));
        assert_eq!(
            (m[0].served_by_other_model, m[1].served_by_other_model),
            (0, 1)
        );
    }
}
