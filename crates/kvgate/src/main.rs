//! The `kvgate` command line.

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
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
