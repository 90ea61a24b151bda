//! `aptix status`: the pipeline's queues as the broker sees them (messages ready, consumers per
//! stage), the dead letters waiting for an operator, and whether every stage has a consumer.

use std::process::ExitCode;

use crate::broker::{Publisher, QueueState};
use crate::config::Settings;
use crate::pipeline;
use crate::worker::block_on;

/// Prints the topology; exit 0 when every stage's queue has a consumer, 1 when one has none
/// (a stage with no worker), 2 when the broker cannot be reached.
pub fn run(settings: Settings, json: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let topology = pipeline::topology(&settings);
        let publisher = match broker(&settings).await {
            Ok(p) => p,
            Err(code) => return Ok(code),
        };
        let states = topology.queue_states(&publisher).await?;
        let idle: Vec<&QueueState> =
            states.iter().filter(|q| q.stage.is_some() && q.consumers == 0).collect();
        if json {
            println!("{}", serde_json::to_string_pretty(&states)?);
        } else {
            print_table(&states);
            for q in &idle {
                let stage = q.stage.unwrap_or("-");
                println!("warning: no consumer on {} (start `aptix worker {stage}`)", q.queue);
            }
        }
        Ok(if idle.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
    })
}

/// A connection to the broker, or exit code 2 with the reason on stderr (the operator
/// commands' shared answer to an unreachable RabbitMQ).
pub(super) async fn broker(settings: &Settings) -> Result<Publisher, ExitCode> {
    Publisher::connect(settings.amqp.url.expose()).await.map_err(|e| {
        eprintln!("RabbitMQ at {} cannot be reached: {e}", settings.amqp.url);
        ExitCode::from(2)
    })
}

fn print_table(states: &[QueueState]) {
    println!("{:<40} {:<10} {:>8} {:>10}", "queue", "stage", "ready", "consumers");
    for q in states {
        let stage = q.stage.unwrap_or("-");
        if q.exists {
            println!("{:<40} {:<10} {:>8} {:>10}", q.queue, stage, q.ready, q.consumers);
        } else {
            println!("{:<40} {:<10} {:>8} {:>10}", q.queue, stage, "missing", "-");
        }
    }
    let dead = states.iter().find(|q| q.queue.ends_with(".dead")).map_or(0, |q| q.ready);
    println!("dead letters waiting: {dead}");
}
