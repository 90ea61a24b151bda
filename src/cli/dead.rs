//! `aptix dead list | show | replay | discard`: the dead letters waiting for an operator, read
//! without taking them, and replayed or discarded one by id while the pipeline runs.

use std::process::ExitCode;

use clap::Subcommand;

use crate::broker::{DeadAction, DeadLetter, Publisher};
use crate::config::Settings;
use crate::dead::Settled;
use crate::store::Store;
use crate::worker::block_on;

use super::printable;

/// `aptix dead ...`
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List the dead letters, oldest first (they stay in the queue).
    List {
        /// Most dead letters to list (at most 10,000: a look holds what it reads).
        #[arg(long, default_value_t = 100, value_parser = look_limit)]
        limit: usize,
        /// Print JSON (bodies included) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print one dead letter: its reason, where it came from, its headers and body.
    Show {
        /// Its message id (`aptix dead list`).
        id: String,
        /// The dead-letter queue it is in (`queue` in `list --json`), when letters of two
        /// queues share its id (a client chooses message ids).
        #[arg(long)]
        queue: Option<String>,
    },
    /// Publish the dead letter again where it came from, then remove it.
    Replay {
        /// Its message id.
        id: String,
        /// The dead-letter queue it is in (`queue` in `list --json`), when letters of two
        /// queues share its id (a client chooses message ids).
        #[arg(long)]
        queue: Option<String>,
        /// Who does it, for the record (default: $USER).
        #[arg(long)]
        actor: Option<String>,
    },
    /// Remove the dead letter for good.
    Discard {
        /// Its message id.
        id: String,
        /// The dead-letter queue it is in (`queue` in `list --json`), when letters of two
        /// queues share its id (a client chooses message ids).
        #[arg(long)]
        queue: Option<String>,
        /// Who does it, for the record (default: $USER).
        #[arg(long)]
        actor: Option<String>,
    },
}

/// Runs `aptix dead`: exit 0 done, 1 no such dead letter (or refused), 2 RabbitMQ or
/// PostgreSQL cannot be reached.
pub fn run(settings: Settings, command: DeadCommand) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let publisher = match super::status::broker(&settings).await {
            Ok(p) => p,
            Err(code) => return Ok(code),
        };
        let topology = crate::pipeline::topology(&settings);
        let code = match command {
            DeadCommand::List { limit, json } => {
                let letters = topology
                    .dead_letters(&publisher, &crate::dead::queues(&settings), (limit, usize::MAX))
                    .await?;
                print_list(&letters, json)?;
                ExitCode::SUCCESS
            }
            DeadCommand::Show { id, queue } => {
                let queues = crate::dead::queues_to_look(&settings, queue.as_deref());
                match topology.dead_letter(&publisher, &queues, &id).await? {
                    Some(letter) => {
                        print_one(&letter)?;
                        ExitCode::SUCCESS
                    }
                    None => not_found(&id),
                }
            }
            DeadCommand::Replay { id, queue, actor } => {
                let which = (id.as_str(), queue.as_deref());
                act(&settings, &publisher, which, DeadAction::Replay, actor).await?
            }
            DeadCommand::Discard { id, queue, actor } => {
                let which = (id.as_str(), queue.as_deref());
                act(&settings, &publisher, which, DeadAction::Discard, actor).await?
            }
        };
        publisher.close(std::time::Duration::from_secs(5)).await;
        Ok(code)
    })
}

async fn act(
    settings: &Settings,
    publisher: &Publisher,
    (id, queue): (&str, Option<&str>),
    action: DeadAction,
    actor: Option<String>,
) -> anyhow::Result<ExitCode> {
    let actor = actor.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "cli".to_owned());
    let store = Store::connect(settings.database.url.expose(), 1)?;
    if !store.ping().await {
        eprintln!("PostgreSQL at {} cannot be reached", settings.database.url);
        return Ok(ExitCode::from(2));
    }
    let done =
        crate::dead::settle(settings, publisher, &store, (id, queue), action, &actor).await?;
    Ok(match done.settled {
        Settled::Done(letter) => {
            let verb = if action == DeadAction::Replay { "replayed" } else { "discarded" };
            let to = letter.original_queue.as_deref().unwrap_or("-");
            let (id, to, reason) = (printable(id), printable(to), printable(&letter.reason));
            println!("{verb} {id} (from {to}; reason: {reason})");
            ExitCode::SUCCESS
        }
        Settled::NotFound => not_found(id),
        Settled::Refused(reason) => {
            eprintln!("not replayed: {reason}");
            ExitCode::from(1)
        }
    })
}

/// `--limit`: a count from 1 to [`MAX_LOOK`](crate::broker::MAX_LOOK).
fn look_limit(text: &str) -> Result<usize, String> {
    let most = crate::broker::MAX_LOOK;
    match text.parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(n),
        _ => Err(format!("a count from 1 to {most} (a look holds what it reads until it ends)")),
    }
}

fn not_found(id: &str) -> ExitCode {
    let id = printable(id);
    let look = crate::broker::MAX_LOOK;
    eprintln!(
        "no dead letter {id} among the oldest {look} of each queue (or another operator holds it \
         right now)"
    );
    ExitCode::from(1)
}

fn print_list(letters: &[DeadLetter], json: bool) -> anyhow::Result<()> {
    if json {
        let with_bodies: Vec<serde_json::Value> = letters.iter().map(as_json).collect();
        println!("{}", serde_json::to_string_pretty(&with_bodies)?);
        return Ok(());
    }
    println!("{:<38} {:<9} {:<38} {:<14} reason", "id", "stage", "session", "turn");
    for l in letters {
        let reason: String = l.reason.chars().take(80).collect();
        let field = |f: &Option<String>| printable(f.as_deref().unwrap_or("-")).into_owned();
        println!(
            "{:<38} {:<9} {:<38} {:<14} {}",
            printable(&l.id),
            field(&l.stage),
            field(&l.session_id),
            field(&l.turn_id),
            printable(&reason),
        );
    }
    println!("{} dead letter(s)", letters.len());
    Ok(())
}

fn print_one(letter: &DeadLetter) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(&as_json(letter))?);
    Ok(())
}

/// The dead letter with its body: JSON when it parses, else text, else base64.
pub fn as_json(letter: &DeadLetter) -> serde_json::Value {
    let mut v = serde_json::to_value(letter).unwrap_or_default();
    let body = match serde_json::from_slice::<serde_json::Value>(&letter.body) {
        Ok(json) => json,
        Err(_) => match letter.body_text() {
            Some(text) => text.into(),
            None => {
                use base64::Engine as _;
                serde_json::json!({ "base64": base64::engine::general_purpose::STANDARD.encode(&letter.body) })
            }
        },
    };
    v["body"] = body;
    v
}

#[cfg(test)]
mod tests {
    use super::look_limit;

    #[test]
    fn a_limit_past_what_one_look_reads_is_refused() {
        assert_eq!(look_limit("100"), Ok(100));
        assert_eq!(look_limit("10000"), Ok(crate::broker::MAX_LOOK));
        for bad in ["0", "10001", "-1", "many"] {
            let error = look_limit(bad).unwrap_err();
            assert!(error.contains("from 1 to 10000"), "{bad}: {error}");
        }
    }
}
