//! Dead-letter actions as an operator takes them, from the command line or the console: checked,
//! done on the broker, and recorded in `operator_actions` before and after.

use serde_json::json;

pub use crate::broker::DeadSettled as Settled;
use crate::broker::{DeadAction, DeadLetter, Publisher, Topology};
use crate::config::Settings;
use crate::store::Store;

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

/// Replays or discards the dead letter `id` as `actor`, and records it.
pub async fn settle(
    settings: &Settings,
    publisher: &Publisher,
    store: &Store,
    id: &str,
    action: DeadAction,
    actor: &str,
) -> anyhow::Result<Settled> {
    let name = match action {
        DeadAction::Replay => "dead.replay",
        DeadAction::Discard => "dead.discard",
    };
    let row = store.start_action(actor, name, id).await?;
    let topology = crate::pipeline::topology(settings);
    let check = |letter: &DeadLetter| match action {
        DeadAction::Replay => replayable(settings, &topology, letter),
        DeadAction::Discard => Ok::<(), NotReplayable>(()),
    };
    let settled = match topology.settle_dead(publisher, &queues(settings), id, action, check).await
    {
        Ok(settled) => settled,
        Err(e) => {
            let detail = json!({ "error": e.to_string() });
            let _ = store.finish_action(row, "failed", &detail).await;
            return Err(e.into());
        }
    };
    let detail = match &settled {
        Settled::Done(l) => json!({
            "reason": l.reason, "stage": l.stage, "original_queue": l.original_queue,
            "session_id": l.session_id, "turn_id": l.turn_id,
        }),
        Settled::Refused(reason) => json!({ "refused": reason }),
        Settled::NotFound => json!({}),
    };
    store.finish_action(row, outcome(&settled), &detail).await?;
    Ok(settled)
}

/// Whether a replay can send `letter` where it came from as it was first sent.
fn replayable(
    settings: &Settings,
    topology: &Topology,
    letter: &DeadLetter,
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
    Ok(())
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
    /// A tenant's request would lose its tenant.
    #[error("a tenant's request is admitted under its publisher's login (here `{0}`); the tenant must resubmit it")]
    TenantRequest(String),
}
