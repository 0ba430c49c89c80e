//! The `kvgate` command line.

mod calibrate;
mod cli_values;
mod decide;
mod demo;
mod loadgen_cli;
mod mock_pod_cli;
mod serve_cli;
mod sim;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kvgate",
    version,
    about = "Cache-aware, latency-predicting router for LLM inference fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One routing decision from a JSON case (what-if questions, debugging, conformance).
    Decide {
        /// The case file, or `-` for stdin.
        #[arg(long, short)]
        input: String,
        /// Run the case N times with consecutive seeds and count picks per pod and branch.
        #[arg(long)]
        repeat: Option<u64>,
    },
    /// Simulate a fleet of vLLM-like pods under a workload, for each policy side by side.
    Sim(Box<sim::SimArgs>),
    /// Serve vLLM-compatible mock pods on CPU, timed by the simulator's engine model.
    MockPod(Box<mock_pod_cli::MockPodCli>),
    /// The OpenAI-compatible gateway: routes each request with the affinity gate.
    Serve(Box<serve_cli::ServeCli>),
    /// Replay a trace or generated workload against an OpenAI endpoint (open loop) and report
    /// TTFT/TPOT/e2e, errors, throughput and the pods' prefix-cache hit rate.
    Loadgen(Box<loadgen_cli::LoadgenCli>),
    /// Fit a simulator profile (step-time terms, KV capacity) to a pod by probing it, check the
    /// fit on held-out probes, and write it for `sim --profile` and `mock-pod --profile`.
    Calibrate(Box<calibrate::CalibrateArgs>),
    /// Four mock pods and the gateway in one process, with a live status line (Ctrl-C stops).
    Demo(Box<demo::DemoArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Decide { input, repeat } => {
            println!("{}", decide::run(&input, repeat)?);
        }
        Command::Sim(args) => sim::run(*args)?,
        Command::MockPod(args) => kvgate_mock_pod::run((*args).into())?,
        Command::Serve(args) => {
            kvgate_gateway::init_tracing();
            tokio::runtime::Runtime::new()?.block_on(kvgate_gateway::serve((*args).into()))?;
        }
        Command::Loadgen(args) => {
            tokio::runtime::Runtime::new()?.block_on(kvgate_loadgen::run((*args).into()))?;
        }
        Command::Calibrate(args) => calibrate::run(*args)?,
        Command::Demo(args) => {
            kvgate_gateway::init_tracing_with_default("warn");
            demo::run(*args)?;
        }
    }
    Ok(())
}
