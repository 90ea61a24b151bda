//! `aptix repartition --from P`: moves the ingress from a layout of P partitions to the
//! configured `amqp.ingress_partitions`, without reordering any session (docs/deploy.md,
//! "Changing the number of ingress partitions").
//!
//! Run it while no validate worker runs (it refuses while the old layout has consumers, or does
//! not exist). It binds the entry exchange to the new layout and
//! unbinds the old one (from then on requests wait in the new layout), admits everything left in
//! the old layout with the validate stage, in order, then deletes the old layout. Validate
//! workers started afterwards with the new setting find only new requests behind the old ones.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::broker::{run_partitioned, run_stage, Publisher, Topology};
use crate::config::Settings;
use crate::pipeline;
use crate::stages::Deps;
use crate::worker::block_on;

/// How often the old layout's depth is read while draining.
const POLL: Duration = Duration::from_millis(500);

/// Runs the move; exit 0 when the old layout is drained and deleted.
pub fn run(settings: Settings, from: u16) -> anyhow::Result<ExitCode> {
    let to = settings.amqp.ingress_partitions;
    anyhow::ensure!(
        from.is_power_of_two() && from <= 1024,
        "--from {from} is not a power of two from 1 to 1024"
    );
    anyhow::ensure!(from != to, "amqp.ingress_partitions is already {to}: nothing to move");
    block_on(async move {
        let shutdown = pipeline::shutdown_on_signals();
        let deps = pipeline::build_deps_patiently(Arc::new(settings), &shutdown)
            .await
            .context("starting the validate stage")?;
        let Some(deps) = deps else { return Ok(ExitCode::FAILURE) };
        let deps = Arc::new(deps);
        let url = deps.settings.amqp.url.expose().to_owned();
        let new = pipeline::topology(&deps.settings);
        let publisher = Publisher::connect(&url).await.context("connecting to RabbitMQ")?;
        // Checked before anything is bound: a wrong --from left both layouts bound (the old
        // one's unbinding failed), and every request was copied into both from then on.
        let (found, consumers) = new.ingress_presence_of(&publisher, from).await?;
        anyhow::ensure!(
            found > 0,
            "no ingress of {from} partition(s) here: --from is the number requests went to until now"
        );
        anyhow::ensure!(
            consumers == 0,
            "{consumers} consumer(s) still read the {from}-partition ingress: stop every validate worker first"
        );
        new.declare(publisher.channel()).await.context("declaring the new layout")?;
        new.unbind_ingress_of(&publisher, from).await.context("unbinding the old layout")?;
        println!("requests now go to {to} partition(s); draining the {from} old one(s)");
        let admitted = drain(&deps, &publisher, from, &shutdown).await?;
        if shutdown.is_cancelled() {
            println!("interrupted; run the same command again to finish");
            return Ok(ExitCode::FAILURE);
        }
        let deleted = new.delete_ingress_of(&publisher, from).await?;
        println!("old layout drained ({admitted} passes) and deleted ({deleted} queues)");
        publisher.close(Duration::from_secs(5)).await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Consumes the old layout with the validate stage until it is empty once its consumer stopped
/// (a stopping consumer returns what it had not started to the queue). Returns the passes made.
async fn drain(
    deps: &Arc<Deps>,
    publisher: &Publisher,
    from: u16,
    shutdown: &CancellationToken,
) -> anyhow::Result<u32> {
    let chain = crate::stages::chain();
    let stage = chain.names()[0];
    let handler = chain.handler(stage, deps).context("the pipeline has no first stage")?;
    let mut settings = pipeline::runtime_settings(&deps.settings, stage);
    let qt = deps.settings.amqp.queue_type;
    settings.topology = chain.topology(deps).with_layout(from, qt).draining();
    let old: Topology = settings.topology.clone();
    let mut passes = 0;
    while !shutdown.is_cancelled() && old.ingress_depth_of(publisher, from).await? > 0 {
        passes += 1;
        let token = shutdown.child_token();
        let (h, s, t) = (handler.clone(), settings.clone(), token.clone());
        let consuming = if from == 1 {
            tokio::spawn(run_stage(stage, h, s, t))
        } else {
            let all: BTreeSet<u16> = (0..from).collect();
            let (keep, share) = tokio::sync::watch::channel(all);
            tokio::spawn(async move {
                // The share never changes; its sender lives as long as the consumer.
                let _keep = keep;
                run_partitioned(stage, h, s, share, t).await
            })
        };
        while !token.is_cancelled() {
            tokio::time::sleep(POLL).await;
            if old.ingress_depth_of(publisher, from).await? == 0 {
                token.cancel();
            }
        }
        let _ = consuming.await;
    }
    Ok(passes)
}
