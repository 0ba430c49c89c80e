//! `kvgate loadgen`'s flags: the clap definition of [`LoadgenArgs`], the loadgen library's plain
//! options. Names, help, defaults and the flags' relations (`--trace` or `--workload`, the class
//! flags only with `--classes`) are what users see in `kvgate loadgen --help`; the defaults live
//! here (the library takes every value explicitly).

use crate::cli_values::one_of_names;
use kvgate_loadgen::LoadgenArgs;
use kvgate_loadgen::plan::GeneratedWorkload;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct LoadgenCli {
    /// Base URL of an OpenAI-compatible endpoint (a pod, kvgate, another router).
    #[arg(long)]
    pub target: String,
    /// Trace file: Mooncake JSONL or Azure CSV (detected from the content).
    #[arg(long, conflicts_with = "workload")]
    pub trace: Option<PathBuf>,
    /// A generated workload instead of a trace.
    #[arg(long, value_parser = one_of_names(&GeneratedWorkload::ALL, GeneratedWorkload::name))]
    pub workload: Option<GeneratedWorkload>,
    /// Preset of the shared-prefix workload: A, B, C or D.
    #[arg(long, default_value = "A")]
    pub preset: String,
    /// Seed of a generated workload.
    #[arg(long, default_value_t = 1)]
    pub workload_seed: u64,
    /// Chat and agent workloads: end a session before a prompt longer than this many tokens
    /// (a pod's context; default 32768).
    #[arg(long)]
    pub max_context_tokens: Option<u32>,
    /// Multiplies the arrival rate (arrival times ÷ F).
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Send only the first N requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Most requests in flight; later ones wait for a slot (their send time slips).
    #[arg(long, default_value_t = 256)]
    pub max_concurrency: usize,
    /// Stream responses (needed for TTFT and TPOT).
    #[arg(long)]
    pub stream: bool,
    /// Send prompts as token ids (one id per synthetic word, `prompt::TOKEN_ID_BASE` + its index)
    /// instead of text, so a real engine sees exactly the planned prompt lengths whatever its
    /// tokenizer (as the simulator does).
    #[arg(long)]
    pub token_prompts: bool,
    /// Model name to send [default: the first of the target's /v1/models].
    #[arg(long)]
    pub model: Option<String>,
    /// A pod's base or /metrics URL for the prefix-cache hit rate (repeatable)
    /// [default: the target's /metrics].
    #[arg(long = "pod-metrics", value_name = "URL")]
    pub pod_metrics: Vec<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_s: f64,
    /// Write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one JSON line per request, in send order: `id`, `sent_unix_ms` (wall clock when it
    /// was sent), `ttft_ms`, `e2e_ms`, `output_tokens`, `error` (kind, or null).
    #[arg(long, value_name = "FILE")]
    pub requests_jsonl: Option<PathBuf>,
    /// No progress bar and no summary.
    #[arg(long)]
    pub quiet: bool,
    /// Tag requests with flow-control classes (priority and tenant headers) as the simulator
    /// does, and report per group (see the `classes` module).
    #[arg(long)]
    pub classes: bool,
    /// Seed of the class tags.
    #[arg(long, default_value_t = 1, requires = "classes")]
    pub class_seed: u64,
    /// Share of requests sent with `x-kvgate-priority: --high-priority`.
    #[arg(long, default_value_t = 0.2, requires = "classes")]
    pub high_share: f64,
    /// The high priority.
    #[arg(long, default_value_t = 1, requires = "classes")]
    pub high_priority: i32,
    /// Tenants (`x-kvgate-tenant: tenant-0` … `tenant-(N-1)`); tenant 0 is the noisy one.
    #[arg(long, default_value_t = 10, requires = "classes")]
    pub tenants: u32,
    /// Tenant 0 sends this many times each other tenant's share.
    #[arg(long, default_value_t = 10.0, requires = "classes")]
    pub noisy_factor: f64,
    /// Keep each of tenant 0's requests with this probability (1 / --noisy-factor: it sends
    /// only its share; the other tenants' requests are unchanged).
    #[arg(long, default_value_t = 1.0, requires = "classes")]
    pub noisy_keep: f64,
    /// Agent workload: compact each session's history every N steps (0: never), as agent
    /// clients do with a long context.
    #[arg(long, default_value_t = 0)]
    pub agent_compact_every: u32,
    /// Send each request's session (the agent workload's) in this header (for example
    /// `x-session-id`, for routers that keep a session on one pod).
    #[arg(long, value_name = "NAME")]
    pub session_header: Option<String>,
}

impl From<LoadgenCli> for LoadgenArgs {
    fn from(cli: LoadgenCli) -> Self {
        LoadgenArgs {
            target: cli.target,
            trace: cli.trace,
            workload: cli.workload,
            preset: cli.preset,
            workload_seed: cli.workload_seed,
            max_context_tokens: cli.max_context_tokens,
            rate_scale: cli.rate_scale,
            max_requests: cli.max_requests,
            max_concurrency: cli.max_concurrency,
            stream: cli.stream,
            token_prompts: cli.token_prompts,
            model: cli.model,
            pod_metrics: cli.pod_metrics,
            timeout_s: cli.timeout_s,
            json: cli.json,
            requests_jsonl: cli.requests_jsonl,
            quiet: cli.quiet,
            classes: cli.classes,
            class_seed: cli.class_seed,
            high_share: cli.high_share,
            high_priority: cli.high_priority,
            tenants: cli.tenants,
            noisy_factor: cli.noisy_factor,
            noisy_keep: cli.noisy_keep,
            agent_compact_every: cli.agent_compact_every,
            session_header: cli.session_header,
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
        args: LoadgenCli,
    }

    fn try_parse(flags: &[&str]) -> Result<LoadgenArgs, clap::Error> {
        let argv = ["kvgate", "--target", "http://t"]
            .into_iter()
            .chain(flags.iter().copied());
        Ok(Cli::try_parse_from(argv)?.args.into())
    }

    fn parse(flags: &[&str]) -> LoadgenArgs {
        try_parse(flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"))
    }

    #[test]
    fn no_flags_give_the_defaults() {
        let expected = LoadgenArgs {
            target: "http://t".into(),
            trace: None,
            workload: None,
            preset: "A".into(),
            workload_seed: 1,
            max_context_tokens: None,
            rate_scale: 1.0,
            max_requests: None,
            max_concurrency: 256,
            stream: false,
            token_prompts: false,
            model: None,
            pod_metrics: Vec::new(),
            timeout_s: 600.0,
            json: None,
            requests_jsonl: None,
            quiet: false,
            classes: false,
            class_seed: 1,
            high_share: 0.2,
            high_priority: 1,
            tenants: 10,
            noisy_factor: 10.0,
            noisy_keep: 1.0,
            agent_compact_every: 0,
            session_header: None,
        };
        assert_eq!(parse(&[]), expected);
        assert!(
            Cli::try_parse_from(["kvgate"]).is_err(),
            "--target is required"
        );
    }

    #[test]
    fn every_flag_lands_in_its_own_field() {
        let args = parse(&[
            "--workload=shared-prefix",
            "--preset=C",
            "--workload-seed=2",
            "--max-context-tokens=3",
            "--rate-scale=4.5",
            "--max-requests=5",
            "--max-concurrency=6",
            "--stream",
            "--token-prompts",
            "--model=m",
            "--pod-metrics=http://p1",
            "--pod-metrics=http://p2/metrics",
            "--timeout-s=7.5",
            "--json=r.json",
            "--requests-jsonl=r.jsonl",
            "--quiet",
            "--classes",
            "--class-seed=8",
            "--high-share=0.5",
            "--high-priority=9",
            "--tenants=11",
            "--noisy-factor=12.5",
            "--noisy-keep=0.25",
            "--agent-compact-every=3",
            "--session-header=x-session-id",
        ]);
        let expected = LoadgenArgs {
            target: "http://t".into(),
            trace: None,
            workload: Some(GeneratedWorkload::SharedPrefix),
            preset: "C".into(),
            workload_seed: 2,
            max_context_tokens: Some(3),
            rate_scale: 4.5,
            max_requests: Some(5),
            max_concurrency: 6,
            stream: true,
            token_prompts: true,
            model: Some("m".into()),
            pod_metrics: vec!["http://p1".into(), "http://p2/metrics".into()],
            timeout_s: 7.5,
            json: Some(PathBuf::from("r.json")),
            requests_jsonl: Some(PathBuf::from("r.jsonl")),
            quiet: true,
            classes: true,
            class_seed: 8,
            high_share: 0.5,
            high_priority: 9,
            tenants: 11,
            noisy_factor: 12.5,
            noisy_keep: 0.25,
            agent_compact_every: 3,
            session_header: Some("x-session-id".into()),
        };
        assert_eq!(args, expected);
        assert_eq!(
            parse(&["--trace=t.jsonl"]).trace,
            Some(PathBuf::from("t.jsonl"))
        );
    }

    #[test]
    fn workloads_parse_by_name_and_unknown_names_are_refused() {
        for workload in GeneratedWorkload::ALL {
            assert_eq!(
                parse(&["--workload", workload.name()]).workload,
                Some(workload)
            );
            assert_eq!(workload.name().parse::<GeneratedWorkload>(), Ok(workload));
        }
        let err = try_parse(&["--workload", "Chat"]).expect_err("names are case-sensitive");
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        assert!("shared_prefix".parse::<GeneratedWorkload>().is_err());
    }

    #[test]
    fn trace_conflicts_with_workload_and_class_flags_need_classes() {
        let err = try_parse(&["--trace=t.jsonl", "--workload=chat"]).expect_err("conflict");
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
        for flag in [
            "--class-seed=2",
            "--high-share=0.5",
            "--high-priority=2",
            "--tenants=2",
            "--noisy-factor=2",
            "--noisy-keep=0.5",
        ] {
            let err = try_parse(&[flag]).expect_err(flag);
            assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
            assert!(try_parse(&[flag, "--classes"]).is_ok(), "{flag}");
        }
    }
}
