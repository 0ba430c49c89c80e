//! `kvgate mock-pod`'s flags: the clap definition of [`MockPodArgs`], the mock-pod library's plain
//! options. Names, help and defaults are what users see in `kvgate mock-pod --help`; the
//! defaults live here (the library takes every value explicitly) and are the library's
//! constants where it has one (`DEFAULT_MODEL`, `DEFAULT_MAX_TOKENS`, the default profile and
//! block size).

use crate::cli_values::one_of;
use kvgate_mock_pod::api::KvRole;
use kvgate_mock_pod::{DEFAULT_MAX_TOKENS, DEFAULT_MODEL, KvEventsEncoding, MockPodArgs};
use kvgate_sim::profiles::Profile;
use std::net::SocketAddr;

#[derive(clap::Args, Debug, Clone)]
pub struct MockPodCli {
    /// Address of the first pod's HTTP server; pod i listens on port + i.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Engine step-time profile: a kvgate-sim profile name, or a JSON file (`*.json`, e.g.
    /// written by `scripts/real-vllm/calibrate.py --profile-out`).
    #[arg(long, default_value = Profile::DEFAULT_NAME)]
    pub profile: String,
    /// Model time runs this many times faster than wall time.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// KV-cache blocks of `--block-size` tokens (default: the profile's token capacity in
    /// such blocks).
    #[arg(long)]
    pub kv_blocks: Option<u32>,
    /// Tokens per KV block: 16 (vLLM's CUDA default) or e.g. 128 (vLLM CPU's default). The
    /// engine model, prefix hits, KV events and `vllm:cache_config_info` follow it. Default:
    /// the profile's `block_size_tokens` (16 in the built-in profiles).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Serve `/v1/completions/render` and `/v1/chat/completions/render` (vLLM's
    /// `--enable-scale-out`); without it they answer 403 as vLLM does.
    #[arg(long)]
    pub enable_scale_out: bool,
    /// Longest prompt + output in tokens (default: the profile's).
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// Served model name; requests for another model get 404.
    #[arg(long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// `max_tokens` for requests that give none.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS)]
    pub default_max_tokens: u32,
    /// Bind a ZMQ PUB socket here for KV events (e.g. tcp://127.0.0.1:5557); pod i uses port + i.
    #[arg(long)]
    pub kv_events: Option<String>,
    /// Bind the KV events replay ROUTER socket here; pod i uses port + i.
    #[arg(long)]
    pub kv_events_replay: Option<String>,
    /// Event layout: `map` (current vLLM) or `array` (older vLLM).
    #[arg(
        long,
        default_value = "map",
        value_parser = one_of(&KvEventsEncoding::ALL, KvEventsEncoding::name, KvEventsEncoding::help)
    )]
    pub kv_events_encoding: KvEventsEncoding,
    /// Topic frame of every KV event message.
    #[arg(long, default_value = "")]
    pub kv_events_topic: String,
    /// Number of pods to start in this process, on consecutive ports.
    #[arg(long, default_value_t = 1)]
    pub count: u16,
    /// Fault injection: cut every stream (connection broken, no `[DONE]`) after N tokens.
    #[arg(long, value_name = "N")]
    pub fail_after: Option<u32>,
    /// Fault injection: accept completion requests and never answer them.
    #[arg(long)]
    pub hang: bool,
    /// Fault injection: `/metrics` answers garbage text.
    #[arg(long)]
    pub garbage_metrics: bool,
    /// Prefill/decode disaggregation, as vLLM's `NixlConnector` `kv_role`: `producer` (a
    /// request with `kv_transfer_params.do_remote_decode` answers with the parameters a decode
    /// pod pulls its KV with), `consumer` (a request with `kv_transfer_params.do_remote_prefill`
    /// computes no prompt token), `both`. Without it, `kv_transfer_params` are ignored, as
    /// vLLM without a KV connector does.
    #[arg(long, value_parser = one_of(&KvRole::ALL, KvRole::name, KvRole::help))]
    pub kv_role: Option<KvRole>,
    /// Engines behind the one HTTP port, as vLLM's `--data-parallel-size`: a request goes to
    /// the engine its `X-data-parallel-rank` header names (out of range: 400), else round
    /// robin; `/metrics` repeats every series per `engine` label; engine r publishes KV events
    /// on the endpoints' port + r.
    #[arg(long, default_value_t = 1)]
    pub data_parallel_size: u32,
}

impl From<MockPodCli> for MockPodArgs {
    fn from(cli: MockPodCli) -> Self {
        MockPodArgs {
            listen: cli.listen,
            profile: cli.profile,
            time_scale: cli.time_scale,
            kv_blocks: cli.kv_blocks,
            block_size: cli.block_size,
            enable_scale_out: cli.enable_scale_out,
            max_model_len: cli.max_model_len,
            model: cli.model,
            default_max_tokens: cli.default_max_tokens,
            kv_events: cli.kv_events,
            kv_events_replay: cli.kv_events_replay,
            kv_events_encoding: cli.kv_events_encoding,
            kv_events_topic: cli.kv_events_topic,
            count: cli.count,
            fail_after: cli.fail_after,
            hang: cli.hang,
            garbage_metrics: cli.garbage_metrics,
            kv_role: cli.kv_role,
            data_parallel_size: cli.data_parallel_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use kvgate_mock_pod::PodConfig;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: MockPodCli,
    }

    fn try_parse(flags: &[&str]) -> Result<MockPodArgs, clap::Error> {
        let argv = std::iter::once("kvgate").chain(flags.iter().copied());
        Ok(Cli::try_parse_from(argv)?.args.into())
    }

    fn parse(flags: &[&str]) -> MockPodArgs {
        try_parse(flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"))
    }

    #[test]
    fn no_flags_give_the_library_defaults() {
        let args = parse(&[]);
        assert_eq!(args.listen, SocketAddr::from(([127, 0, 0, 1], 8000)));
        assert_eq!(args.count, 1);
        let config = PodConfig::from_args(&args).unwrap();
        let default = PodConfig::default();
        assert_eq!(config.profile.name, default.profile.name);
        assert_eq!(config.kv_blocks, default.kv_blocks);
        assert_eq!(config.block_size_tokens, default.block_size_tokens);
        assert_eq!(config.enable_scale_out, default.enable_scale_out);
        assert_eq!(config.time_scale, default.time_scale);
        assert_eq!(config.model, default.model);
        assert_eq!(config.default_max_tokens, default.default_max_tokens);
        assert_eq!(config.kv_events, default.kv_events);
        assert_eq!(config.kv_events_replay, default.kv_events_replay);
        assert_eq!(config.kv_events_encoding, default.kv_events_encoding);
        assert_eq!(config.kv_events_topic, default.kv_events_topic);
        assert_eq!(config.kv_role, default.kv_role);
        assert_eq!(config.data_parallel_size, default.data_parallel_size);
    }

    #[test]
    fn every_flag_lands_in_its_own_field() {
        let args = parse(&[
            "--listen=127.0.0.1:1",
            "--profile=p.json",
            "--time-scale=2.5",
            "--kv-blocks=3",
            "--block-size=128",
            "--enable-scale-out",
            "--max-model-len=4",
            "--model=m",
            "--default-max-tokens=5",
            "--kv-events=tcp://127.0.0.1:6",
            "--kv-events-replay=tcp://127.0.0.1:7",
            "--kv-events-encoding=array",
            "--kv-events-topic=t",
            "--count=8",
            "--fail-after=9",
            "--hang",
            "--garbage-metrics",
            "--kv-role=consumer",
            "--data-parallel-size=10",
        ]);
        let expected = MockPodArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 1)),
            profile: "p.json".into(),
            time_scale: 2.5,
            kv_blocks: Some(3),
            block_size: Some(128),
            enable_scale_out: true,
            max_model_len: Some(4),
            model: "m".into(),
            default_max_tokens: 5,
            kv_events: Some("tcp://127.0.0.1:6".into()),
            kv_events_replay: Some("tcp://127.0.0.1:7".into()),
            kv_events_encoding: KvEventsEncoding::Array,
            kv_events_topic: "t".into(),
            count: 8,
            fail_after: Some(9),
            hang: true,
            garbage_metrics: true,
            kv_role: Some(KvRole::Consumer),
            data_parallel_size: 10,
        };
        assert_eq!(args, expected);
    }

    #[test]
    fn kinds_parse_by_name_and_unknown_names_are_refused() {
        for role in KvRole::ALL {
            assert_eq!(parse(&["--kv-role", role.name()]).kv_role, Some(role));
            assert_eq!(role.name().parse::<KvRole>(), Ok(role));
        }
        for encoding in KvEventsEncoding::ALL {
            let args = parse(&["--kv-events-encoding", encoding.name()]);
            assert_eq!(args.kv_events_encoding, encoding);
            assert_eq!(encoding.name().parse::<KvEventsEncoding>(), Ok(encoding));
        }
        for flags in [
            ["--kv-role", "Producer"],
            ["--kv-events-encoding", "msgpack"],
        ] {
            let err = try_parse(&flags).expect_err("unknown name");
            assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        }
        assert!("Producer".parse::<KvRole>().is_err());
    }
}
