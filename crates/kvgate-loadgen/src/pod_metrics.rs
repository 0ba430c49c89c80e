//! The pods' prefix-cache counters, read before and after a run.
//!
//! `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total` (prompt tokens found in
//! the prefix cache / prompt tokens looked up) are summed over all series of every URL; the hit
//! rate of the run is Δhits / Δqueries. The parser is tolerant: a line it cannot read is skipped,
//! a URL that does not answer (or has neither counter) makes the whole figure unknown rather
//! than wrong. Bodies are read up to [`MAX_METRICS_BYTES`].

use std::time::Duration;

/// Largest `/metrics` body read.
pub const MAX_METRICS_BYTES: usize = 4 << 20;
const HITS: &str = "vllm:prefix_cache_hits_total";
const QUERIES: &str = "vllm:prefix_cache_queries_total";

/// Summed prefix-cache counters (tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrefixCounters {
    pub hits: f64,
    pub queries: f64,
}

impl PrefixCounters {
    /// Hit rate between `before` and `self`; `None` when nothing was queried.
    pub fn hit_rate_since(&self, before: &PrefixCounters) -> Option<f64> {
        let q = self.queries - before.queries;
        let h = self.hits - before.hits;
        (q > 0.0 && h >= 0.0).then(|| (h / q).clamp(0.0, 1.0))
    }
}

/// Sums the two counters in Prometheus text; `None` when the queries counter is absent.
pub fn parse_prefix_counters(text: &str) -> Option<PrefixCounters> {
    let mut c = PrefixCounters::default();
    let mut seen = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let (name, is_hits) = if line.starts_with(HITS) {
            (HITS, true)
        } else if line.starts_with(QUERIES) {
            (QUERIES, false)
        } else {
            continue;
        };
        let rest = &line[name.len()..];
        // The name must end here: `{labels}` or whitespace, not a longer metric name.
        let rest = if let Some(r) = rest.strip_prefix('{') {
            match r.rfind('}') {
                Some(end) => &r[end + 1..],
                None => continue,
            }
        } else if rest.starts_with([' ', '\t']) {
            rest
        } else {
            continue;
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite())
        else {
            continue;
        };
        if is_hits {
            c.hits += value;
        } else {
            c.queries += value;
            seen = true;
        }
    }
    seen.then_some(c)
}

/// Reads and sums the counters of every URL (`…/metrics`); `None` if any fails.
pub async fn scrape_all(client: &reqwest::Client, urls: &[String]) -> Option<PrefixCounters> {
    if urls.is_empty() {
        return None;
    }
    let mut total = PrefixCounters::default();
    for url in urls {
        let c = scrape(client, url).await?;
        total.hits += c.hits;
        total.queries += c.queries;
    }
    Some(total)
}

async fn scrape(client: &reqwest::Client, url: &str) -> Option<PrefixCounters> {
    let mut resp = client
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if body.len() + chunk.len() > MAX_METRICS_BYTES {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    parse_prefix_counters(&String::from_utf8_lossy(&body))
}

/// `URL` as a metrics URL: kept if it already ends in `/metrics`, else `URL/metrics`.
pub fn metrics_url(url: &str) -> String {
    let u = url.trim_end_matches('/');
    if u.ends_with("/metrics") {
        u.to_owned()
    } else {
        format!("{u}/metrics")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_series_and_bad_lines_skipped() {
        let text = "# HELP x\n\
            vllm:prefix_cache_queries_total{model_name=\"a\",engine=\"0\"} 100\n\
            vllm:prefix_cache_queries_total{model_name=\"a\",engine=\"1\"} 50\n\
            vllm:prefix_cache_hits_total{model_name=\"a\"} 30\n\
            vllm:prefix_cache_hits_total_created 99\n\
            vllm:prefix_cache_hits_total{broken 7\n\
            vllm:prefix_cache_hits_total nonsense\n";
        let c = parse_prefix_counters(text).unwrap();
        assert_eq!(
            c,
            PrefixCounters {
                hits: 30.0,
                queries: 150.0
            }
        );
        let after = PrefixCounters {
            hits: 90.0,
            queries: 250.0,
        };
        assert_eq!(after.hit_rate_since(&c), Some(0.6));
        assert_eq!(c.hit_rate_since(&c), None);
        assert_eq!(parse_prefix_counters("other 1\n"), None);
    }

    #[test]
    fn metrics_urls_get_the_path_once() {
        assert_eq!(metrics_url("http://a:1/"), "http://a:1/metrics");
        assert_eq!(metrics_url("http://a:1/metrics"), "http://a:1/metrics");
    }
}
