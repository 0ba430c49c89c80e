//! `kvgate serve`'s flags: the clap definition of [`ServeArgs`], the gateway library's plain
//! options. Names, help, the defaults shown and `KVGATE_API_KEYS` are what users see in
//! `kvgate serve --help`; the defaults themselves are applied by the library
//! (`GatewayConfig::resolve`: flag over config file over default), so every flag here is
//! optional.

use crate::cli_values::one_of;
use kvgate_gateway::ServeArgs;
use kvgate_gateway::config::IndexKind;
use kvgate_gateway::discovery::DiscoveryKind;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct ServeCli {
    /// Traffic listener (OpenAI API) [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Admin listener (/metrics, /debug/decisions, /debug/config, /healthz, /readyz)
    /// [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// A pod's base URL, e.g. http://10.0.0.5:8000 (repeatable; adds to the config file's
    /// pods), optionally with its KV-events endpoints:
    /// `URL,events=tcp://HOST:5557,replay=tcp://HOST:5558[,model=NAME][,class=NAME][,role=both|prefill|decode][,dp=N]`
    /// (`role`: prefill/decode disaggregation, default `both`; `dp`: a vLLM server with
    /// `--data-parallel-size N`, routed as N engines `URL#dp0`…, each pinned with
    /// `X-data-parallel-rank`, its events on the endpoints' port + rank).
    #[arg(long = "pod", value_name = "URL[,events=…,replay=…]")]
    pub pod: Vec<String>,
    /// Prefix index: routed (learns from routing) or engine (KV-cache events + token mode,
    /// routed fallback for pods without live events) [default: routed].
    #[arg(long, value_parser = one_of(&IndexKind::ALL, IndexKind::name, IndexKind::help))]
    pub index: Option<IndexKind>,
    /// The served model's tokenizer.json for token mode (`--index engine`), so prompts are cut
    /// into the same token blocks as the pods' KV events; read at start [default: the built-in
    /// cl100k, the mock pod's].
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// A Jinja chat template to render chat prompts with in token mode, instead of the model's
    /// own (chat_template.jinja or tokenizer_config.json next to --tokenizer, which it needs);
    /// use the file the pods serve with `vllm serve --chat-template` [default: the model's].
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Token mode: MiB of token ids kept to reuse across prompts (a conversation's next turn
    /// tokenizes only its new messages); 0 turns it off [default: 64].
    #[arg(long, value_name = "MIB")]
    pub tokenization_cache_mib: Option<usize>,
    /// Config file (TOML, or YAML with a .yaml/.yml extension); reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Routing policy [default: affinity-gate].
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// How often each pod's /metrics is scraped [default: 50].
    #[arg(long, value_name = "MS")]
    pub scrape_interval_ms: Option<u64>,
    /// How often each pod's /v1/models (the models it serves) is read again [default: 10000].
    #[arg(long, value_name = "MS")]
    pub models_refresh_interval_ms: Option<u64>,
    /// Seed of the decision RNG [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Do not add x-kvgate-pod / x-kvgate-branch to responses.
    #[arg(long)]
    pub no_response_headers: bool,
    /// Append one Mooncake JSONL line per served request to FILE (lengths and prefix-chained
    /// span ids, no text), for `kvgate sim --trace FILE`.
    #[arg(long, value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// Append one JSON line per routed request to FILE when it ends: its decision as
    /// /debug/decisions shows it (each pod's predicted TTFT, prefix score, load), the branch,
    /// and the TTFT / TPOT observed.
    #[arg(long, value_name = "FILE")]
    pub decisions_log: Option<PathBuf>,
    /// Also serve the Envoy ext_proc endpoint-picker protocol (gRPC
    /// `envoy.service.ext_proc.v3.ExternalProcessor`, plus gRPC health) on ADDR, e.g.
    /// 127.0.0.1:9002; see deploy/envoy/.
    #[arg(long, value_name = "ADDR")]
    pub ext_proc_listen: Option<SocketAddr>,
    /// Requests served at once on the traffic listener; more wait in the queue [default: 1024].
    #[arg(long, value_name = "N")]
    pub max_concurrent_requests: Option<usize>,
    /// Requests waiting for a slot; beyond it, 429 with `Retry-After` [default: 1024].
    #[arg(long, value_name = "N")]
    pub max_queued_requests: Option<usize>,
    /// API key clients must send as `Authorization: Bearer KEY` on /v1/* (repeatable,
    /// comma-separated); the keys of KVGATE_API_KEYS (comma-separated) are accepted too, with or
    /// without --api-key [default: none: no authentication].
    #[arg(long = "api-key", value_name = "KEY", value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// Forward the client's Authorization header to the pods [default: dropped].
    #[arg(long)]
    pub forward_authorization: bool,
    /// On SIGTERM/Ctrl-C, how long in-flight requests may still run [default: 10000].
    #[arg(long, value_name = "MS")]
    pub shutdown_grace_ms: Option<u64>,
    /// Upstream TCP connect timeout; a pod that does not accept in time is retried elsewhere
    /// [default: 2000].
    #[arg(long, value_name = "MS")]
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for a pod's response headers; then the request goes to another pod, or 502
    /// [default: 60000].
    #[arg(long, value_name = "MS")]
    pub first_byte_timeout_ms: Option<u64>,
    /// Longest silence between two chunks of a pod's response; then a stream ends with an SSE
    /// error event [default: 60000].
    #[arg(long, value_name = "MS")]
    pub idle_chunk_timeout_ms: Option<u64>,
    /// Longest prompt accepted, in tokens as the index counts them (estimated from characters
    /// in the routed index); longer prompts get 400 `context_length_exceeded`
    /// [default: 1048576].
    #[arg(long, value_name = "TOKENS")]
    pub max_prompt_tokens: Option<u32>,
    /// Where pods come from besides --pod and the config file: static (only those) or
    /// kubernetes (the ready Pods matching --selector, kept in sync by a watch; needs a kvgate
    /// built with `--features k8s`) [default: static].
    #[arg(long, value_parser = one_of(&DiscoveryKind::ALL, DiscoveryKind::name, DiscoveryKind::help))]
    pub discovery: Option<DiscoveryKind>,
    /// With --discovery kubernetes: the model-server Pods' label selector, e.g. app=vllm.
    #[arg(long, value_name = "KEY=VALUE")]
    pub selector: Option<String>,
    /// With --discovery kubernetes: the Pods' namespace [default: the kubeconfig context's, or
    /// the service account's namespace in a cluster].
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// With --discovery kubernetes: the model server's port on each Pod [default: 8000].
    #[arg(long, value_name = "PORT")]
    pub target_port: Option<u16>,
    /// Longest life of one request, from admission to its last byte; then a stream ends with an
    /// SSE error event (`request_timeout`), a request without response yet gets 504
    /// [default: 600000].
    #[arg(long, value_name = "MS")]
    pub request_timeout_ms: Option<u64>,
    /// On SIGTERM/Ctrl-C, how long /readyz answers 503 while requests are still accepted, before
    /// the listener closes, so that load balancers notice; a second signal skips it
    /// [default: 5000].
    #[arg(long, value_name = "MS")]
    pub shutdown_drain_ms: Option<u64>,
    /// Responses in a row dying mid-body (connection reset, truncated, silent past the idle-chunk
    /// timeout) on one pod before the pod is avoided for the cooldown [default: 3].
    #[arg(long, value_name = "N")]
    pub pod_failure_threshold: Option<u32>,
    /// How long a pod is avoided after `--pod-failure-threshold` failures in a row, even while
    /// its /metrics answers [default: 10000].
    #[arg(long, value_name = "MS")]
    pub pod_failure_cooldown_ms: Option<u64>,
    /// Traffic connections open at once; beyond it a connection is closed at accept (keep
    /// `ulimit -n` above it); read at start [default: 8192].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Longest wait for a whole request head, from the connection's accept or the head's first
    /// byte; then the connection is closed [default: 10000].
    #[arg(long, value_name = "MS")]
    pub header_read_timeout_ms: Option<u64>,
    /// How long a keep-alive connection with no request in flight stays open [default: 75000].
    #[arg(long, value_name = "MS")]
    pub idle_connection_timeout_ms: Option<u64>,
    /// Longest a client may accept no byte of its response (a stream it stopped reading); then
    /// the connection is closed and the request's slot released [default: 60000].
    #[arg(long, value_name = "MS")]
    pub client_write_timeout_ms: Option<u64>,
    /// Share routing state (in-flight load, routed prefixes) with the other replicas on this
    /// NATS server, so that several replicas route as one [default: off].
    #[arg(long, value_name = "nats://HOST:PORT")]
    pub cluster: Option<String>,
    /// The fleet's name on the --cluster server: replicas of one fleet share it, other fleets
    /// may share the server under other names [default: default].
    #[arg(long, value_name = "NAME")]
    pub cluster_name: Option<String>,
}

/// The environment variable of the API keys, comma-separated.
pub const API_KEYS_VAR: &str = "KVGATE_API_KEYS";

/// The accepted API keys: `--api-key`'s and `KVGATE_API_KEYS`'s, both (a key given in one place
/// must not silently disable the other's: clap's `env` read the variable only without the flag),
/// blanks and repeats dropped, in that order.
fn api_keys(flags: Vec<String>, env: Option<&str>) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let from_env = env
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::to_string);
    for key in flags.into_iter().chain(from_env) {
        let key = key.trim();
        if !key.is_empty() && !keys.iter().any(|k| k == key) {
            keys.push(key.to_string());
        }
    }
    keys
}

impl From<ServeCli> for ServeArgs {
    fn from(cli: ServeCli) -> Self {
        ServeArgs {
            listen: cli.listen,
            admin_listen: cli.admin_listen,
            pod: cli.pod,
            index: cli.index,
            tokenizer: cli.tokenizer,
            chat_template: cli.chat_template,
            tokenization_cache_mib: cli.tokenization_cache_mib,
            config: cli.config,
            policy: cli.policy,
            scrape_interval_ms: cli.scrape_interval_ms,
            models_refresh_interval_ms: cli.models_refresh_interval_ms,
            seed: cli.seed,
            no_response_headers: cli.no_response_headers,
            capture: cli.capture,
            decisions_log: cli.decisions_log,
            ext_proc_listen: cli.ext_proc_listen,
            max_concurrent_requests: cli.max_concurrent_requests,
            max_queued_requests: cli.max_queued_requests,
            api_key: api_keys(cli.api_key, std::env::var(API_KEYS_VAR).ok().as_deref()),
            forward_authorization: cli.forward_authorization,
            shutdown_grace_ms: cli.shutdown_grace_ms,
            connect_timeout_ms: cli.connect_timeout_ms,
            first_byte_timeout_ms: cli.first_byte_timeout_ms,
            idle_chunk_timeout_ms: cli.idle_chunk_timeout_ms,
            max_prompt_tokens: cli.max_prompt_tokens,
            discovery: cli.discovery,
            selector: cli.selector,
            namespace: cli.namespace,
            target_port: cli.target_port,
            request_timeout_ms: cli.request_timeout_ms,
            shutdown_drain_ms: cli.shutdown_drain_ms,
            pod_failure_threshold: cli.pod_failure_threshold,
            pod_failure_cooldown_ms: cli.pod_failure_cooldown_ms,
            max_connections: cli.max_connections,
            header_read_timeout_ms: cli.header_read_timeout_ms,
            idle_connection_timeout_ms: cli.idle_connection_timeout_ms,
            client_write_timeout_ms: cli.client_write_timeout_ms,
            cluster: cli.cluster,
            cluster_name: cli.cluster_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeCli,
    }

    fn parse(flags: &[&str]) -> ServeArgs {
        let argv = std::iter::once("kvgate").chain(flags.iter().copied());
        Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("{flags:?}: {e}"))
            .args
            .into()
    }

    #[test]
    fn api_keys_of_the_flag_and_the_variable_are_both_accepted() {
        let flags = vec!["k1".to_string(), " k2 ".to_string()];
        assert_eq!(api_keys(flags.clone(), None), ["k1", "k2"]);
        assert_eq!(
            api_keys(flags, Some("k3,k1,,k4 ")),
            ["k1", "k2", "k3", "k4"],
            "merged, not the variable ignored"
        );
        assert_eq!(api_keys(Vec::new(), Some("e1,e2")), ["e1", "e2"]);
        assert!(api_keys(Vec::new(), Some(" , ")).is_empty());
    }

    #[test]
    fn no_flags_leave_every_option_unset() {
        let mut args = parse(&[]);
        // KVGATE_API_KEYS may be set where the tests run; the flags below pin --api-key.
        args.api_key.clear();
        assert_eq!(args, ServeArgs::default());
    }

    #[test]
    fn every_flag_lands_in_its_own_field() {
        let mut args = parse(&[
            "--listen=127.0.0.1:1",
            "--admin-listen=127.0.0.1:2",
            "--pod=http://10.0.0.1:8000",
            "--pod=http://10.0.0.2:8000,events=tcp://10.0.0.2:5557",
            "--index=engine",
            "--tokenizer=tok.json",
            "--chat-template=chat.jinja",
            "--tokenization-cache-mib=22",
            "--config=kvgate.toml",
            "--policy=prefix",
            "--scrape-interval-ms=3",
            "--seed=4",
            "--no-response-headers",
            "--capture=cap.jsonl",
            "--decisions-log=dec.jsonl",
            "--ext-proc-listen=127.0.0.1:5",
            "--max-concurrent-requests=6",
            "--max-queued-requests=7",
            "--api-key=k1,k2",
            "--api-key=k3",
            "--forward-authorization",
            "--shutdown-grace-ms=8",
            "--connect-timeout-ms=9",
            "--first-byte-timeout-ms=10",
            "--idle-chunk-timeout-ms=11",
            "--max-prompt-tokens=12",
            "--discovery=kubernetes",
            "--selector=app=vllm",
            "--namespace=ns",
            "--target-port=13",
            "--request-timeout-ms=14",
            "--shutdown-drain-ms=15",
            "--pod-failure-threshold=16",
            "--pod-failure-cooldown-ms=17",
            "--max-connections=18",
            "--header-read-timeout-ms=19",
            "--idle-connection-timeout-ms=20",
            "--client-write-timeout-ms=21",
            "--cluster=nats://127.0.0.1:4222",
            "--cluster-name=fleet-a",
            "--models-refresh-interval-ms=23",
        ]);
        let addr = |port: u16| Some(SocketAddr::from(([127, 0, 0, 1], port)));
        let expected = ServeArgs {
            listen: addr(1),
            admin_listen: addr(2),
            pod: vec![
                "http://10.0.0.1:8000".into(),
                "http://10.0.0.2:8000,events=tcp://10.0.0.2:5557".into(),
            ],
            index: Some(IndexKind::Engine),
            tokenizer: Some(PathBuf::from("tok.json")),
            chat_template: Some(PathBuf::from("chat.jinja")),
            tokenization_cache_mib: Some(22),
            config: Some(PathBuf::from("kvgate.toml")),
            policy: Some("prefix".into()),
            scrape_interval_ms: Some(3),
            models_refresh_interval_ms: Some(23),
            seed: Some(4),
            no_response_headers: true,
            capture: Some(PathBuf::from("cap.jsonl")),
            decisions_log: Some(PathBuf::from("dec.jsonl")),
            ext_proc_listen: addr(5),
            max_concurrent_requests: Some(6),
            max_queued_requests: Some(7),
            api_key: vec!["k1".into(), "k2".into(), "k3".into()],
            forward_authorization: true,
            shutdown_grace_ms: Some(8),
            connect_timeout_ms: Some(9),
            first_byte_timeout_ms: Some(10),
            idle_chunk_timeout_ms: Some(11),
            max_prompt_tokens: Some(12),
            discovery: Some(DiscoveryKind::Kubernetes),
            selector: Some("app=vllm".into()),
            namespace: Some("ns".into()),
            target_port: Some(13),
            request_timeout_ms: Some(14),
            shutdown_drain_ms: Some(15),
            pod_failure_threshold: Some(16),
            pod_failure_cooldown_ms: Some(17),
            max_connections: Some(18),
            header_read_timeout_ms: Some(19),
            idle_connection_timeout_ms: Some(20),
            client_write_timeout_ms: Some(21),
            cluster: Some("nats://127.0.0.1:4222".into()),
            cluster_name: Some("fleet-a".into()),
        };
        // KVGATE_API_KEYS may be set where the tests run: its keys come after the flags'.
        args.api_key.truncate(3);
        assert_eq!(args, expected);
    }

    #[test]
    fn kinds_parse_by_name_and_unknown_names_are_refused() {
        assert_eq!(parse(&["--index", "routed"]).index, Some(IndexKind::Routed));
        assert_eq!(
            parse(&["--discovery", "static"]).discovery,
            Some(DiscoveryKind::Static)
        );
        let err = Cli::try_parse_from(["kvgate", "--index", "Engine"])
            .err()
            .expect("names are case-sensitive, as with ValueEnum");
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }
}
