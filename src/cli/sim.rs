//! `aptix sim`: runs the Responses API simulator until Ctrl-C or SIGTERM. It prints its base URL
//! (`http://ADDR/v1`) on standard output once it listens, so scripts can wait for that line.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use crate::sim::{self, Fault, Latency, SimConfig};
use crate::telemetry::{self, LogFormat};

/// Options of `aptix sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8089")]
    pub listen: SocketAddr,
    /// Fixed latency before each answer, milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Random extra latency, 0..=N milliseconds.
    #[arg(long, default_value_t = 0)]
    pub jitter_ms: u64,
    /// Delay between stream events, milliseconds.
    #[arg(long, default_value_t = 0)]
    pub event_delay_ms: u64,
    /// Require `Authorization: Bearer KEY` (else 401).
    #[arg(long, env = "APTIX_SIM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Request bodies kept for `GET /_sim/requests`.
    #[arg(long, default_value_t = 1000)]
    pub log_capacity: usize,
    /// Responses kept for `previous_response_id` (the oldest are evicted).
    #[arg(long, default_value_t = 50_000)]
    pub store_capacity: usize,
    /// Characters per streamed delta.
    #[arg(long, default_value_t = 16)]
    pub delta_chars: usize,
    /// Probability (0-1) of a 429 with `Retry-After: 1` on each request.
    #[arg(long, default_value_t = 0.0)]
    pub rate_limit_rate: f64,
    /// Probability (0-1) of a 500 on each request.
    #[arg(long, default_value_t = 0.0)]
    pub server_error_rate: f64,
    /// Probability (0-1) of a dropped connection on each request.
    #[arg(long, default_value_t = 0.0)]
    pub disconnect_rate: f64,
}

/// Runs the simulator on its own runtime until a shutdown signal.
pub fn run(args: SimArgs, log_format: Option<LogFormat>) -> anyhow::Result<ExitCode> {
    telemetry::init(log_format.unwrap_or_default());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve(args: SimArgs) -> anyhow::Result<()> {
    let config = SimConfig {
        listen: args.listen,
        latency: Latency {
            fixed_ms: args.latency_ms,
            jitter_ms: args.jitter_ms,
            per_event_ms: args.event_delay_ms,
        },
        api_key: args.api_key,
        log_capacity: args.log_capacity,
        store_capacity: args.store_capacity,
        delta_chars: args.delta_chars,
        hang_limit: Duration::from_secs(300),
    };
    let handle = sim::start(config).await?;
    let faults = handle.faults();
    faults.fail_randomly(
        Fault::RateLimit { retry_after_ms: None, retry_after_secs: Some(1) },
        args.rate_limit_rate,
    );
    faults.fail_randomly(Fault::ServerError, args.server_error_rate);
    faults.fail_randomly(Fault::Disconnect, args.disconnect_rate);
    println!("{}", handle.base_url());
    shutdown_signal().await?;
    tracing::info!("responses simulator stopping");
    handle.shutdown().await;
    Ok(())
}

async fn shutdown_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
