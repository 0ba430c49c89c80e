//! `kvgate serve`'s flags. Every setting is a key of the gateway's one settings tree
//! (`kvgate_gateway::Settings`, docs/operation.md), set in the config file, the environment
//! (`KVGATE_<KEY>`, `__` between levels) or here with `--set key.path=value`; the flags below
//! are sugar for the everyday keys. The flags of earlier releases still work, hidden, each as
//! `--set` of its key ([`OLD_FLAGS`]). The layers are merged by the library.

use crate::cli_values::one_of;
use kvgate_gateway::ServeArgs;
use kvgate_gateway::config::IndexKind;
use kvgate_gateway::discovery::DiscoveryKind;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct ServeCli {
    /// Config file (TOML; YAML with a .yaml/.yml extension; JSON with .json, e.g. a saved
    /// /debug/config); reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set any key (repeatable, applied in order, over the file and the KVGATE_… environment):
    /// `--set max_retries=1`, `--set router.affinity_gate_tau=0.7`, `--set pods+=URL`
    /// (`+=` appends to a list). Every key is in docs/operation.md.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// `listen`: the traffic listener (OpenAI API) [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// `admin_listen`: /metrics, /debug/decisions, /debug/config, /healthz, /readyz
    /// [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// A pod's base URL, e.g. http://10.0.0.5:8000 (repeatable; added to the `pods` of the file
    /// and environment), optionally with its KV-events endpoints and options:
    /// `URL,events=tcp://HOST:5557,replay=tcp://HOST:5558[,model=NAME][,class=NAME][,role=both|prefill|decode][,dp=N]`.
    #[arg(long = "pod", value_name = "URL[,events=…,replay=…]")]
    pub pod: Vec<String>,
    /// `policy`: the routing policy [default: affinity-gate].
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// `index`: the prefix index (start only) [default: routed].
    #[arg(long, value_parser = one_of(&IndexKind::ALL, IndexKind::name, IndexKind::help))]
    pub index: Option<IndexKind>,
    /// `tokenizer`: the served model's tokenizer.json for token mode (`--index engine`)
    /// [default: the built-in cl100k, the mock pod's].
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// `discovery`: where pods come from besides `pods` [default: static].
    #[arg(long, value_parser = one_of(&DiscoveryKind::ALL, DiscoveryKind::name, DiscoveryKind::help))]
    pub discovery: Option<DiscoveryKind>,
    /// `selector`: with kubernetes discovery, the model-server Pods' label selector, e.g.
    /// app=vllm.
    #[arg(long, value_name = "KEY=VALUE")]
    pub selector: Option<String>,
    /// `ext_proc_listen`: also serve the Envoy ext_proc endpoint picker (gRPC) on ADDR; see
    /// deploy/envoy/.
    #[arg(long, value_name = "ADDR")]
    pub ext_proc_listen: Option<SocketAddr>,
    /// `cluster`: share routing state with the other replicas on this NATS server
    /// [default: off].
    #[arg(long, value_name = "nats://HOST:PORT")]
    pub cluster: Option<String>,
    /// API key clients must send as `Authorization: Bearer KEY` on /v1/* (repeatable,
    /// comma-separated); the keys of KVGATE_API_KEYS are accepted too. A secret, not a setting:
    /// never in /debug/config [default: none: no authentication].
    #[arg(long = "api-key", value_name = "KEY", value_delimiter = ',')]
    pub api_key: Vec<String>,
    /// The flags of earlier releases, hidden: each is `--set` of its key.
    #[command(flatten)]
    pub old_flags: OldFlags,
}

/// Flags of earlier releases and the key each sets: `(flag, key, value)`, where a value makes
/// the flag a switch that sets it. Hidden from `--help`; they keep scripts working.
pub const OLD_FLAGS: &[(&str, &str, Option<&str>)] = &[
    ("chat-template", "chat_template", None),
    ("tokenization-cache-mib", "tokenization_cache_mib", None),
    ("scrape-interval-ms", "scrape_interval_ms", None),
    (
        "models-refresh-interval-ms",
        "models_refresh_interval_ms",
        None,
    ),
    ("seed", "seed", None),
    ("no-response-headers", "response_headers", Some("false")),
    ("capture", "capture", None),
    ("decisions-log", "decisions_log", None),
    ("max-concurrent-requests", "max_concurrent_requests", None),
    ("max-queued-requests", "max_waiting_requests", None),
    (
        "forward-authorization",
        "forward_authorization",
        Some("true"),
    ),
    ("shutdown-grace-ms", "shutdown_grace_ms", None),
    ("connect-timeout-ms", "connect_timeout_ms", None),
    ("first-byte-timeout-ms", "first_byte_timeout_ms", None),
    ("idle-chunk-timeout-ms", "idle_chunk_timeout_ms", None),
    ("max-prompt-tokens", "max_prompt_tokens", None),
    ("namespace", "namespace", None),
    ("target-port", "target_port", None),
    ("request-timeout-ms", "request_timeout_ms", None),
    ("shutdown-drain-ms", "shutdown_drain_ms", None),
    ("pod-failure-threshold", "pod_failure_threshold", None),
    ("pod-failure-cooldown-ms", "pod_failure_cooldown_ms", None),
    ("max-connections", "max_connections", None),
    ("header-read-timeout-ms", "header_read_timeout_ms", None),
    (
        "idle-connection-timeout-ms",
        "idle_connection_timeout_ms",
        None,
    ),
    ("client-write-timeout-ms", "client_write_timeout_ms", None),
    ("cluster-name", "cluster_name", None),
];

/// The hidden [`OLD_FLAGS`] given, as `key=value` assignments in command-line order.
#[derive(Debug, Clone, Default)]
pub struct OldFlags(pub Vec<String>);

impl clap::FromArgMatches for OldFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut given: Vec<(usize, String)> = Vec::new();
        for &(flag, key, switch) in OLD_FLAGS {
            let Some(indices) = m.indices_of(flag) else {
                continue;
            };
            match switch {
                Some(value) => {
                    if m.get_flag(flag) {
                        given.extend(indices.map(|i| (i, format!("{key}={value}"))));
                    }
                }
                None => {
                    let values = m.get_many::<String>(flag).into_iter().flatten();
                    given.extend(indices.zip(values).map(|(i, v)| (i, format!("{key}={v}"))));
                }
            }
        }
        given.sort_by_key(|(i, _)| *i);
        Ok(OldFlags(given.into_iter().map(|(_, s)| s).collect()))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for OldFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        OLD_FLAGS.iter().fold(cmd, |cmd, &(flag, key, switch)| {
            let arg = clap::Arg::new(flag)
                .long(flag)
                .hide(true)
                .help(format!("`--set {key}=…`"));
            cmd.arg(match switch {
                Some(_) => arg.action(clap::ArgAction::SetTrue),
                None => arg.action(clap::ArgAction::Append).value_name("VALUE"),
            })
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
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

impl ServeCli {
    /// The layers: the file, `env` (the process's variables), then the flags (the sugar flags,
    /// the old ones, `--set` in that order), and the API keys.
    pub fn into_args(self, env: Vec<(String, String)>) -> ServeArgs {
        let api_keys_var = env
            .iter()
            .find(|(k, _)| k == API_KEYS_VAR)
            .map(|(_, v)| v.clone());
        ServeArgs {
            config: self.config,
            env,
            set: self.old_flags.0.into_iter().chain(self.set).collect(),
            pod: self.pod,
            api_key: api_keys(self.api_key, api_keys_var.as_deref()),
            listen: self.listen,
            admin_listen: self.admin_listen,
            policy: self.policy,
            index: self.index,
            tokenizer: self.tokenizer,
            discovery: self.discovery,
            selector: self.selector,
            ext_proc_listen: self.ext_proc_listen,
            cluster: self.cluster,
            ..ServeArgs::default()
        }
    }
}

impl From<ServeCli> for ServeArgs {
    fn from(cli: ServeCli) -> Self {
        cli.into_args(std::env::vars().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};
    use kvgate_gateway::GatewayConfig;
    use std::time::Duration;

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
            .into_args(Vec::new())
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
    fn help_shows_at_most_twelve_flags_besides_set() {
        let cmd = Cli::command();
        let shown: Vec<&str> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long())
            .filter(|l| *l != "set")
            .collect();
        assert!(shown.len() <= 12, "{} flags: {shown:?}", shown.len());
    }

    #[test]
    fn no_flags_give_no_layer() {
        assert_eq!(parse(&[]), ServeArgs::default());
    }

    #[test]
    fn every_flag_old_and_new_sets_its_key() {
        let args = parse(&[
            "--listen=127.0.0.1:1",
            "--admin-listen=127.0.0.1:2",
            "--pod=http://10.0.0.1:8000",
            "--pod=http://10.0.0.2:8000,events=tcp://10.0.0.2:5557",
            "--index=engine",
            "--tokenizer=tok.json",
            "--chat-template=chat.jinja",
            "--tokenization-cache-mib=22",
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
            "--set=max_retries=0",
            "--set=router.epsilon_explore_sticky=0",
        ]);
        assert_eq!(args.api_key, ["k1", "k2", "k3"]);
        let c = GatewayConfig::from_args(&args).unwrap();
        let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let ms = Duration::from_millis;
        assert_eq!(c.listen, addr(1));
        assert_eq!(c.admin_listen, addr(2));
        let urls: Vec<&str> = c.pods.iter().map(|p| p.url.as_str()).collect();
        assert_eq!(urls, ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]);
        assert_eq!(c.pod_events.len(), 1);
        assert_eq!(c.index, IndexKind::Engine);
        assert_eq!(c.tokenizer, Some(PathBuf::from("tok.json")));
        assert_eq!(c.chat_template, Some(PathBuf::from("chat.jinja")));
        assert_eq!(c.tokenization_cache_mib, 22);
        assert_eq!(c.policy.name(), "prefix");
        assert_eq!(c.scrape_interval, ms(3));
        assert_eq!(c.seed, 4);
        assert!(!c.response_headers);
        assert_eq!(c.capture, Some(PathBuf::from("cap.jsonl")));
        assert_eq!(c.decisions_log, Some(PathBuf::from("dec.jsonl")));
        assert_eq!(c.ext_proc_listen, Some(addr(5)));
        assert_eq!(c.max_concurrent_requests, 6);
        assert_eq!(c.max_waiting_requests, 7);
        assert_eq!(c.api_keys.len(), 3);
        assert!(c.forward_authorization);
        assert_eq!(c.shutdown_grace, ms(8));
        assert_eq!(c.connect_timeout, ms(9));
        assert_eq!(c.first_byte_timeout, ms(10));
        assert_eq!(c.idle_chunk_timeout, ms(11));
        assert_eq!(c.max_prompt_tokens, 12);
        assert_eq!(c.discovery, DiscoveryKind::Kubernetes);
        assert_eq!(c.selector.as_deref(), Some("app=vllm"));
        assert_eq!(c.namespace.as_deref(), Some("ns"));
        assert_eq!(c.target_port, 13);
        assert_eq!(c.request_timeout, ms(14));
        assert_eq!(c.shutdown_drain, ms(15));
        assert_eq!(c.pod_failure_threshold, 16);
        assert_eq!(c.pod_failure_cooldown, ms(17));
        assert_eq!(c.max_connections, 18);
        assert_eq!(c.header_read_timeout, ms(19));
        assert_eq!(c.idle_connection_timeout, ms(20));
        assert_eq!(c.client_write_timeout, ms(21));
        assert_eq!(c.cluster.as_deref(), Some("nats://127.0.0.1:4222"));
        assert_eq!(c.cluster_name, "fleet-a");
        assert_eq!(c.models_refresh_interval, ms(23));
        assert_eq!(c.max_retries, 0);
        assert_eq!(c.router.epsilon_explore_sticky, 0.0);
    }

    #[test]
    fn set_wins_over_an_old_flag_and_the_environment() {
        let cli = Cli::try_parse_from([
            "kvgate",
            "--set",
            "seed=2",
            "--seed",
            "1",
            "--set",
            "max_retries=5",
        ])
        .unwrap();
        let env = vec![
            ("KVGATE_SEED".to_string(), "9".to_string()),
            ("KVGATE_API_KEYS".to_string(), "e1".to_string()),
        ];
        let args = cli.args.into_args(env);
        assert_eq!(args.api_key, ["e1"]);
        let c = GatewayConfig::from_args(&args).unwrap();
        assert_eq!((c.seed, c.max_retries), (2, 5));
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
