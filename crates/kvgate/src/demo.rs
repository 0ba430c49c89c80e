//! `kvgate demo`: four mock pods and the gateway in one process, a ready-to-paste curl
//! command, and a one-line live status every second until Ctrl-C.
//!
//! The pods are `kvgate_mock_pod` pods on ephemeral 127.0.0.1 ports (engine profile
//! `llama3-8b-h100`, time scale 1 by default); the gateway is `kvgate_gateway::Gateway` on
//! `--listen` (127.0.0.1:8080) and `--admin-listen` (127.0.0.1:9090), both accepting port 0.
//! Stdout starts with one parseable line, `kvgate demo: listening on http://ADDR admin
//! http://ADDR`, which the end-to-end test reads.
//!
//! Status line: routed requests (ok / other outcomes) and their gate branches, read from the
//! gateway's own `kvgate_requests_total`; the prefix-cache hit rate across pods, Σ
//! `prefix_cache_hits` / Σ `prefix_cache_queries` (tokens) from the pods' engine metrics; and
//! the gateway's in-flight requests.
//!
//! `--traffic` also runs a built-in multi-turn chat load against the gateway: `--users`
//! closed-loop users, each holding conversations of 2–6 turns on one of four shared system
//! prompts, with 0.1–1 s of think time between turns. Memory: one conversation history per
//! user, at most 6 turns.

use anyhow::Context as _;
use kvgate_gateway::{Gateway, ServeArgs};
use kvgate_mock_pod::{PodConfig, RunningPod};
use kvgate_sim::profiles::Profile;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Traffic listener of the gateway (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Admin listener of the gateway (/ui, the live page; /metrics, /debug/decisions,
    /// /debug/config, /healthz, /readyz).
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub admin_listen: SocketAddr,
    /// Mock pods to start.
    #[arg(long, default_value_t = 4)]
    pub pods: u16,
    /// Engine step-time profile of the mock pods.
    #[arg(long, default_value = "llama3-8b-h100")]
    pub profile: String,
    /// Model time runs this many times faster than wall time in the pods.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Routing policy [default: affinity-gate].
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Also drive a built-in multi-turn chat load against the gateway.
    #[arg(long)]
    pub traffic: bool,
    /// Concurrent chat users of `--traffic`.
    #[arg(long, default_value_t = 8)]
    pub users: u32,
    /// Interval of the live status line, ms (0: no status line).
    #[arg(long, default_value_t = 1000)]
    pub status_interval_ms: u64,
}

/// How long the pods get to show up healthy in the gateway.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: DemoArgs) -> anyhow::Result<()> {
    if args.pods == 0 {
        anyhow::bail!("--pods must be at least 1");
    }
    let profile = Profile::resolve(&args.profile)?;
    let pod_config = PodConfig {
        profile: profile.clone(),
        time_scale: args.time_scale,
        ..PodConfig::default()
    };
    let any_port: SocketAddr = ([127, 0, 0, 1], 0).into();
    let pods = kvgate_mock_pod::spawn_pods(&pod_config, any_port, args.pods)
        .await
        .context("starting the mock pods")?;
    let urls: Vec<String> = pods.iter().map(RunningPod::url).collect();
    let gw = Gateway::start(ServeArgs {
        listen: Some(args.listen),
        admin_listen: Some(args.admin_listen),
        pod: urls.clone(),
        policy: args.policy.clone(),
        ..ServeArgs::default()
    })
    .await
    .context("starting the gateway")?;
    wait_healthy(&gw, &urls).await?;

    let base = format!("http://{}", gw.traffic_addr);
    let admin = format!("http://{}", gw.admin_addr);
    let model = pod_config.model.clone();
    println!("kvgate demo: listening on {base} admin {admin}");
    for (i, url) in urls.iter().enumerate() {
        println!(
            "  mock pod {i}: {url} (profile {}, time scale {})",
            profile.name, args.time_scale
        );
    }
    println!(
        "  policy {}; try (-D - prints the x-kvgate-pod and x-kvgate-branch headers: which pod, and why):\n\ncurl -sN -D - {base}/v1/chat/completions -H 'content-type: application/json' \\\n  -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}], \"max_tokens\": 16, \"stream\": true}}'\n",
        gw.shared().config().policy.name()
    );
    println!("  live page: {admin}/ui");
    println!("  admin: {admin}/metrics  {admin}/debug/decisions  {admin}/readyz");
    if !args.traffic {
        println!("  or rerun with --traffic for a built-in multi-turn chat load.");
    }
    println!("  Ctrl-C stops.");
    let _ = std::io::stdout().flush();

    let mut traffic = tokio::task::JoinSet::new();
    if args.traffic {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .context("building the traffic client")?;
        for user in 0..args.users {
            traffic.spawn(chat_user(client.clone(), base.clone(), model.clone(), user));
        }
    }

    let started = Instant::now();
    let interval = Duration::from_millis(args.status_interval_ms.max(1));
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            _ = ticker.tick(), if args.status_interval_ms > 0 => {
                println!("{}", status_line(&gw, &pods, started.elapsed()));
                let _ = std::io::stdout().flush();
            }
        }
    }
    traffic.shutdown().await;
    println!("kvgate demo: shutting down");
    drop(gw);
    drop(pods);
    Ok(())
}

async fn wait_healthy(gw: &Gateway, urls: &[String]) -> anyhow::Result<()> {
    let deadline = Instant::now() + HEALTHY_TIMEOUT;
    loop {
        let unhealthy: Vec<&String> = urls
            .iter()
            .filter(|u| gw.pod_healthy(u) != Some(true))
            .collect();
        if unhealthy.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("mock pods not healthy after {HEALTHY_TIMEOUT:?}: {unhealthy:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Routed requests from the gateway's `kvgate_requests_total`, by branch and by status.
#[derive(Debug, Default, PartialEq)]
pub struct RequestCounts {
    pub by_branch: BTreeMap<String, u64>,
    pub by_status: BTreeMap<String, u64>,
}

impl RequestCounts {
    pub fn total(&self) -> u64 {
        self.by_status.values().sum()
    }
}

/// The value of label `name` in a `{a="x",b="y"}` label set (no escapes in our labels' values
/// except inside pod URLs, which never contain quotes).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = labels.find(&key)? + key.len();
    let len = labels.get(start..)?.find('"')?;
    labels.get(start..start + len)
}

/// Reads `kvgate_requests_total` series from OpenMetrics text; malformed lines are skipped.
pub fn request_counts(metrics_text: &str) -> RequestCounts {
    let mut counts = RequestCounts::default();
    for line in metrics_text.lines() {
        let Some(rest) = line.strip_prefix("kvgate_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let n = value.max(0.0) as u64;
        if let Some(b) = label(labels, "branch") {
            *counts.by_branch.entry(b.to_string()).or_default() += n;
        }
        if let Some(s) = label(labels, "status") {
            *counts.by_status.entry(s.to_string()).or_default() += n;
        }
    }
    counts
}

fn status_line(gw: &Gateway, pods: &[RunningPod], elapsed: Duration) -> String {
    let counts = gw
        .shared()
        .metrics_text()
        .map(|t| request_counts(&t))
        .unwrap_or_default();
    let (mut hits, mut queries) = (0u64, 0u64);
    for pod in pods {
        if let Ok(m) = pod.metrics.lock() {
            hits += m.engine.prefix_cache_hits_tokens;
            queries += m.engine.prefix_cache_queries_tokens;
        }
    }
    let hit_rate = if queries > 0 {
        format!("{:.1}%", 100.0 * hits as f64 / queries as f64)
    } else {
        "-".into()
    };
    let in_flight: u32 = {
        let pods = gw.shared().fleet.pods.all();
        let session = gw.shared().session.lock();
        pods.iter().map(|p| session.in_flight(p.id).requests).sum()
    };
    let ok = counts.by_status.get("ok").copied().unwrap_or(0);
    let branches = if counts.by_branch.is_empty() {
        "-".to_string()
    } else {
        counts
            .by_branch
            .iter()
            .map(|(b, n)| format!("{b} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "[{:>5.0}s] requests {} (ok {ok}) | prefix hit {hit_rate} | branches: {branches} | in flight {in_flight}",
        elapsed.as_secs_f64(),
        counts.total(),
    )
}

/// Four shared system prompts, so conversations of different users share prefixes. Each is
/// followed by [`HOUSE_RULES`]: real system prompts are long, and a long shared history is what
/// makes a conversation's next turn a prefix-cache hit worth keeping (prefix score above the
/// gate's `affinity_gate_tau`).
const SYSTEM_PROMPTS: [&str; 4] = [
    "You are a concise assistant for a cloud infrastructure team. Answer with short, precise sentences and prefer concrete commands over prose.",
    "You are a patient tutor of mathematics. Explain each step, check the student's reasoning, and end with one question that tests understanding.",
    "You are a travel planner. Suggest itineraries with times, distances and costs, and ask about the traveller's budget before recommending hotels.",
    "You are a code reviewer for Rust services. Point out ownership, error handling and performance issues, each with a suggested fix.",
];

const HOUSE_RULES: &str = "House rules. 1. Be accurate: when you are not sure, say so and say \
how the user could check. 2. Be brief: lead with the answer, then the reasoning, then the \
caveats. 3. Use the user's words for things, and define any term they did not use. 4. Prefer \
numbered steps for procedures and tables for comparisons. 5. Give units with every number. \
6. Never invent references, commands or APIs; name the documentation page instead. 7. When a \
request is ambiguous, state the reading you chose and answer it. 8. Keep the conversation's \
earlier decisions in mind and point out when a new request contradicts one. 9. End with the \
one next step the user should take. 10. Be kind, and keep the tone of a colleague who wants \
the user to succeed. 11. Avoid jargon unless the user used it first. 12. When you give code, \
give the smallest complete example that runs, and say what it prints.";

const QUESTIONS: [&str; 8] = [
    "Can you help me with this?",
    "What would you do first, and why?",
    "Give me an example.",
    "What are the trade-offs?",
    "How would that change at ten times the scale?",
    "Summarise what we decided so far.",
    "What could go wrong?",
    "Anything else I should know?",
];

/// xorshift64*: enough randomness for think times and turn counts, seeded per user.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One closed-loop chat user of `--traffic`: conversations of 2–6 turns, forever.
async fn chat_user(client: reqwest::Client, base: String, model: String, user: u32) {
    let mut rng =
        Rng(0x9e37_79b9_7f4a_7c15 ^ (u64::from(user) + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let url = format!("{base}/v1/chat/completions");
    let mut conversation = 0u64;
    loop {
        conversation += 1;
        let system = SYSTEM_PROMPTS[rng.below(SYSTEM_PROMPTS.len() as u64) as usize];
        let mut messages = vec![
            json!({"role": "system", "content": format!("{system}\n\n{HOUSE_RULES}")}),
            json!({"role": "user", "content": format!("User {user}, conversation {conversation}: I am planning a project and need advice.")}),
        ];
        let turns = 2 + rng.below(5);
        for _ in 0..turns {
            let body =
                json!({"model": model, "messages": messages, "max_tokens": 16 + rng.below(24)});
            let answer = match client.post(&url).json(&body).send().await {
                Ok(resp) if resp.status().is_success() => resp.json::<Value>().await.ok(),
                _ => None,
            };
            let content = answer
                .as_ref()
                .and_then(|a| a.pointer("/choices/0/message/content"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            messages.push(json!({"role": "assistant", "content": content}));
            let q = QUESTIONS[rng.below(QUESTIONS.len() as u64) as usize];
            messages.push(json!({"role": "user", "content": q}));
            tokio::time::sleep(Duration::from_millis(100 + rng.below(900))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_counts_sum_by_branch_and_status_and_skip_malformed_lines() {
        let text = "# TYPE kvgate_requests counter\n\
            kvgate_requests_total{pod=\"http://a\",policy=\"affinity-gate\",branch=\"exploit\",status=\"ok\"} 5\n\
            kvgate_requests_total{pod=\"http://b\",policy=\"affinity-gate\",branch=\"exploit\",status=\"ok\"} 2\n\
            kvgate_requests_total{pod=\"http://b\",policy=\"affinity-gate\",branch=\"explore\",status=\"client_abort\"} 1\n\
            kvgate_requests_total{pod=\"http://b\",branch=\"explore\",status=\"ok\"} nope\n\
            kvgate_requests_total{broken\n\
            kvgate_retries_total 3\n";
        let c = request_counts(text);
        assert_eq!(c.total(), 8);
        assert_eq!(c.by_branch.get("exploit"), Some(&7));
        assert_eq!(c.by_branch.get("explore"), Some(&1));
        assert_eq!(c.by_status.get("ok"), Some(&7));
        assert_eq!(c.by_status.get("client_abort"), Some(&1));
    }
}
