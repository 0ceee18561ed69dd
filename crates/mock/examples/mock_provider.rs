//! Stand-alone mock provider, the same as `switchyard mock-provider`:
//! `cargo run -p switchyard-mock --example mock_provider -- --config crates/mock/mocks.example.yaml`.

use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: switchyard_mock::MockArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    switchyard_mock::run(Cli::parse().args).await
}
