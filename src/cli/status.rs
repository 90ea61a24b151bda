//! `aptix status`: the pipeline's queues as the broker sees them (messages ready, consumers per
//! stage; with the management API also unacked messages, rates and the workers consuming), the
//! dead letters waiting for an operator, whether every stage has a consumer, and (in the table)
//! each money budget's use.

use std::process::ExitCode;

use crate::broker::management::Management;
use crate::broker::{with_activity, Publisher, QueueState};
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
        let missing = topology.missing_plugin(&publisher).await?;
        let mut states = topology.queue_states(&publisher, &settings.tenant_names()).await?;
        let note = activity(&settings, &mut states).await;
        if let Some(problem) = &missing {
            eprintln!("error: {problem}");
        }
        let idle: Vec<&QueueState> =
            states.iter().filter(|q| q.stage.is_some() && q.consumers == 0).collect();
        if json {
            println!("{}", serde_json::to_string_pretty(&states)?);
        } else {
            print_table(&states);
            print_workers(&states);
            match super::budgets::read(&settings).await {
                Ok(budgets) => super::budgets::print(&budgets),
                Err(e) => println!("warning: budgets unavailable: {e:#}"),
            }
            if let Some(note) = note {
                println!("{note}");
            }
            for q in &idle {
                let stage = q.stage.unwrap_or("-");
                println!("warning: no consumer on {} (start `aptix worker {stage}`)", q.queue);
            }
        }
        Ok(if idle.is_empty() && missing.is_none() { ExitCode::SUCCESS } else { ExitCode::from(1) })
    })
}

/// A connection to the broker, or exit code 2 with the reason on stderr (the operator
/// commands' shared answer to an unreachable RabbitMQ). It takes the broker's frames: `aptix
/// dead` reads dead letters with it, which hold what clients wrote.
pub(super) async fn broker(settings: &Settings) -> Result<Publisher, ExitCode> {
    Publisher::connect_reading_clients(settings.amqp.url.expose()).await.map_err(|e| {
        eprintln!("RabbitMQ at {} cannot be reached: {e}", settings.amqp.url);
        ExitCode::from(2)
    })
}

/// Rates and workers from the management API when it is configured; a note when it failed.
async fn activity(settings: &Settings, states: &mut [QueueState]) -> Option<String> {
    let result = match Management::configured(&settings.amqp) {
        Ok(None) => return None,
        Ok(Some(api)) => with_activity(states, &api).await,
        Err(e) => Err(e),
    };
    result.err().map(|e| format!("warning: rates and workers unavailable: {e}"))
}

fn print_table(states: &[QueueState]) {
    println!(
        "{:<40} {:<10} {:>8} {:>10} {:>8} {:>8} {:>8}",
        "queue", "stage", "ready", "consumers", "unacked", "in/s", "acked/s"
    );
    for q in states {
        let stage = q.stage.unwrap_or("-");
        let (ready, consumers) = match q.exists {
            true => (q.ready.to_string(), q.consumers.to_string()),
            false => ("missing".to_owned(), "-".to_owned()),
        };
        let (unacked, publish, ack) = match &q.activity {
            Some(a) => (a.unacked.to_string(), rate(a.publish_per_s), rate(a.ack_per_s)),
            None => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        println!(
            "{:<40} {stage:<10} {ready:>8} {consumers:>10} {unacked:>8} {publish:>8} {ack:>8}",
            q.queue
        );
    }
    let dead = states.iter().find(|q| q.queue.ends_with(".dead")).map_or(0, |q| q.ready);
    println!("dead letters waiting: {dead}");
}

fn rate(per_s: f64) -> String {
    format!("{per_s:.1}")
}

/// Each stage's workers: the connections consuming its queues, as they named themselves.
fn print_workers(states: &[QueueState]) {
    for q in states {
        let (Some(stage), Some(a)) = (q.stage, &q.activity) else { continue };
        for worker in &a.workers {
            println!("worker  {stage:<10} {worker}  (consuming {})", q.queue);
        }
    }
}
