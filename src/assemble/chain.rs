//! The chain decision (Session Architecture §9, DESIGN.md §5.6): continue the provider chain
//! with `previous_response_id`, or start a new one because there is no previous response, the
//! last one is older than the provider's retention, or the provider said it no longer has it.
//! A new chain of a session with history is rehydrated; one without history is simply new.

use chrono::{DateTime, Utc};

use super::record::{ChainReason, ChainRecord, ChainStatus};
use super::state::{ChainState, SessionState};
use crate::chunk::Chunk;
use crate::config::AssemblePolicy;

/// The chain decision for the next request of a session.
#[derive(Debug, Clone)]
pub struct ChainPlan<'a> {
    record: ChainRecord,
    continuing: Option<&'a ChainState>,
}

impl<'a> ChainPlan<'a> {
    /// New, continued or rehydrated, and why.
    pub fn record(&self) -> &ChainRecord {
        &self.record
    }

    /// The chain being continued, `None` when a new chain starts.
    pub fn continuing(&self) -> Option<&'a ChainState> {
        self.continuing
    }

    /// Whether the chunk `id` is already in the chain the next request goes to.
    pub fn has_chunk(&self, id: &str) -> bool {
        self.continuing.is_some_and(|c| c.has_chunk(id))
    }
}

/// Decides how the next request of the session relates to the provider chain, at time `now`.
pub fn plan_chain<'a>(
    state: &'a SessionState,
    policy: &AssemblePolicy,
    now: DateTime<Utc>,
) -> ChainPlan<'a> {
    let reason = match &state.chain {
        Some(chain) => {
            let expired_at = policy.expires_at(chain.responded_at);
            if now < expired_at {
                let reason = ChainReason::PreviousResponseFresh {
                    previous_response_id: chain.previous_response_id.clone(),
                    responded_at: chain.responded_at,
                };
                let record = ChainRecord { status: ChainStatus::Continued, reason };
                return ChainPlan { record, continuing: Some(chain) };
            }
            ChainReason::PreviousResponseExpired {
                previous_response_id: chain.previous_response_id.clone(),
                responded_at: chain.responded_at,
                expired_at,
            }
        }
        None => state.chain_reset.clone().unwrap_or(ChainReason::NoPreviousResponse),
    };
    let status = if state.has_history() { ChainStatus::Rehydrated } else { ChainStatus::New };
    ChainPlan { record: ChainRecord { status, reason }, continuing: None }
}

/// The chunks of `retrieved` the next request should send: not already in the chain, each id
/// once, in retrieval order. The retrieve stage may use it to skip chunks early; assembly applies
/// it again, so applying it twice is harmless.
pub fn unsent_chunks(
    state: &SessionState,
    policy: &AssemblePolicy,
    now: DateTime<Utc>,
    retrieved: &[Chunk],
) -> Vec<Chunk> {
    let plan = plan_chain(state, policy, now);
    split_chunks(&plan, retrieved).0.into_iter().cloned().collect()
}

/// Splits `retrieved` into (to send, already in the chain), dropping repeated ids.
pub(crate) fn split_chunks<'c>(
    plan: &ChainPlan<'_>,
    retrieved: &'c [Chunk],
) -> (Vec<&'c Chunk>, Vec<&'c Chunk>) {
    let mut seen = std::collections::HashSet::new();
    retrieved.iter().filter(|c| seen.insert(c.id.as_str())).partition(|c| !plan.has_chunk(&c.id))
}
