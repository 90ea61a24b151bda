//! Dead-letter actions as an operator takes them, from the command line or the console: checked,
//! done on the broker, and recorded in `operator_actions` before and after.

use serde_json::json;
use tracing::warn;

pub use crate::broker::DeadSettled as Settled;
use crate::broker::{DeadAction, DeadLetter, Publisher, Topology};
use crate::config::Settings;
use crate::contracts::{headers, SessionId, TurnId, TurnKey};
use crate::store::{Store, TurnState};

/// The `operator_actions` outcome of `settled`.
fn outcome(settled: &Settled) -> &'static str {
    match settled {
        Settled::Done(_) => "done",
        Settled::NotFound => "not_found",
        Settled::Refused(_) => "refused",
    }
}

/// Every dead-letter queue of the deployment: the shared one and each configured tenant's.
pub fn queues(settings: &Settings) -> Vec<String> {
    crate::pipeline::topology(settings).dead_queues(&settings.tenant_names())
}

/// A dead-letter action as it was recorded: its `operator_actions` row, and how it ended.
#[derive(Debug)]
pub struct Recorded {
    /// The row's id, from which the console tells what was done after redirecting.
    pub action: i64,
    /// How it ended.
    pub settled: Settled,
}

/// The dead-letter queues to look in for one letter: all of them, or the one named (none when
/// it names no dead-letter queue of the deployment). A message id is the client's to choose, so
/// two letters in two queues can share one; naming the queue picks the letter the operator saw.
pub fn queues_to_look(settings: &Settings, queue: Option<&str>) -> Vec<String> {
    let all = queues(settings);
    match queue {
        Some(q) => all.into_iter().filter(|d| d == q).collect(),
        None => all,
    }
}

/// Replays or discards the dead letter `id` (in `queue`, when named) as `actor`, and records
/// it.
pub async fn settle(
    settings: &Settings,
    publisher: &Publisher,
    store: &Store,
    (id, queue): (&str, Option<&str>),
    action: DeadAction,
    actor: &str,
) -> anyhow::Result<Recorded> {
    let name = match action {
        DeadAction::Replay => "dead.replay",
        DeadAction::Discard => "dead.discard",
    };
    let row = store.start_action(actor, name, id).await?;
    let topology = &crate::pipeline::topology(settings);
    let dead = queues_to_look(settings, queue);
    let settled =
        match settle_checked(settings, topology, (publisher, store), (id, &dead), action).await {
            Ok(settled) => settled,
            Err(e) => {
                let detail = json!({ "error": e.to_string() });
                let _ = store.finish_action(row, "failed", &detail).await;
                return Err(e);
            }
        };
    let detail = match &settled {
        Settled::Done(l) => json!({
            "reason": l.reason, "stage": l.stage, "original_queue": l.original_queue, "queue": l.queue,
            "session_id": l.session_id, "turn_id": l.turn_id,
        }),
        Settled::Refused(reason) => json!({ "refused": reason }),
        Settled::NotFound => json!({}),
    };
    // What was done on the broker stands: a record that cannot be finished is no reason to
    // report it failed (and have it done again).
    if let Err(error) = store.finish_action(row, outcome(&settled), &detail).await {
        warn!(action = row, %error, "dead-letter action done, its record not finished");
    }
    Ok(Recorded { action: row, settled })
}

/// The action, done unless the letter is not replayable. The turn a stage's letter names is
/// read first, with no letter held: the letters a look reads stay hidden from every other
/// operator (and consumer) until it ends, so it waits on nothing but the broker.
async fn settle_checked(
    settings: &Settings,
    topology: &Topology,
    (publisher, store): (&Publisher, &Store),
    (id, dead): (&str, &[String]),
    action: DeadAction,
) -> anyhow::Result<Settled> {
    let turn = match action {
        DeadAction::Replay => match topology.dead_letter(publisher, dead, id).await? {
            Some(letter) => turn_of(store, &letter).await?,
            None => return Ok(Settled::NotFound),
        },
        DeadAction::Discard => None,
    };
    let check = |letter: &DeadLetter| match action {
        DeadAction::Replay => replayable(settings, topology, letter, turn.as_ref()),
        DeadAction::Discard => Ok(()),
    };
    Ok(topology.settle_dead(publisher, dead, id, action, check).await?)
}

/// A turn's key, state and step.
type TurnAt = (TurnKey, TurnState, i32);

/// Where the turn `letter` names stands; none when it names none the database holds.
async fn turn_of(store: &Store, letter: &DeadLetter) -> anyhow::Result<Option<TurnAt>> {
    let Some(key) = key_of(letter) else { return Ok(None) };
    Ok(store.turn(&key).await?.map(|t| (key, t.state, t.step)))
}

fn key_of(letter: &DeadLetter) -> Option<TurnKey> {
    let session_id: SessionId = letter.session_id.as_deref()?.parse().ok()?;
    let turn_id: TurnId = letter.turn_id.as_deref()?.parse().ok()?;
    Some(TurnKey { session_id, turn_id })
}

/// Whether a replay can send `letter` where it came from as it was first sent, and do something
/// there; `turn`: where the turn it names stood just before.
fn replayable(
    settings: &Settings,
    topology: &Topology,
    letter: &DeadLetter,
    turn: Option<&TurnAt>,
) -> Result<(), NotReplayable> {
    let Some(queue) = &letter.original_queue else {
        return Err(NotReplayable::NoQueue);
    };
    let ingress = topology.is_ingress_queue(queue);
    // Only the pipeline's own queues: a letter's description may come from the broker's death
    // records, which a client can pre-set on what it publishes.
    if !ingress && !topology.is_inner_stage_queue(queue) {
        return Err(NotReplayable::Foreign(queue.clone()));
    }
    if ingress && letter.session_id.is_none() {
        return Err(NotReplayable::NoSession);
    }
    // The broker sets `user_id` to the publisher's own login only; a replay would lose the
    // tenant and be refused at admission, so the tenant resubmits it (`aptix dead show`).
    if ingress && !settings.tenants.is_empty() {
        let login = letter.user.as_deref().unwrap_or("unknown").to_owned();
        return Err(NotReplayable::TenantRequest(login));
    }
    if ingress {
        return Ok(());
    }
    running_its_step(letter, turn)
}

/// Whether the turn of a stage's `letter` still runs the step the letter is of. A stage gives
/// a message up by ending its turn (the client gets the error reply), so its letter is worth
/// replaying only when that could not be written; otherwise the stage would run (and a provider
/// charge) for a turn no one waits for.
fn running_its_step(letter: &DeadLetter, turn: Option<&TurnAt>) -> Result<(), NotReplayable> {
    // The letter read again to be settled is the one whose turn was read.
    let same = |(key, ..): &&TurnAt| key_of(letter).as_ref() == Some(key);
    let Some((_, state, at)) = turn.filter(same) else { return Err(NotReplayable::NoTurn) };
    let step = letter.headers.get(headers::STEP).and_then(|s| s.parse::<i32>().ok());
    if *state == TurnState::Running && step.is_none_or(|s| s == *at) {
        return Ok(());
    }
    Err(NotReplayable::TurnMovedOn { state: state.as_str(), step: *at })
}

/// Why a dead letter cannot be replayed.
#[derive(Debug, thiserror::Error)]
enum NotReplayable {
    /// It says nowhere where it came from.
    #[error("the dead letter names no original queue")]
    NoQueue,
    /// It names a queue that is not a stage of this pipeline.
    #[error("`{0}` is not a queue of this pipeline's stages")]
    Foreign(String),
    /// A request without a session cannot be routed.
    #[error("the request names no SessionId, so it cannot be routed again")]
    NoSession,
    /// A stage's message that names no turn the database holds.
    #[error("the dead letter names no turn this pipeline holds")]
    NoTurn,
    /// Its turn ended, or runs another step, since it was given up.
    #[error("its turn is {state} at step {step}: the turn has ended (its client has the answer or the error) or moved on, so a replay would run the stage for nothing")]
    TurnMovedOn {
        /// The turn's state.
        state: &'static str,
        /// The step the turn is at.
        step: i32,
    },
    /// A tenant's request would lose its tenant.
    #[error("a tenant's request is admitted under its publisher's login (here `{0}`); the tenant must resubmit it")]
    TenantRequest(String),
}
