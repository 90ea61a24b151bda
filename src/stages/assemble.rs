//! Assemble: the turn and its chunks in; the `/responses` body and the record of what it sends
//! out. The work is the pure `crate::assemble`; this stage loads the session state for it, and
//! the follow-ups waiting to steer the turn.

use std::sync::Arc;

use super::Deps;
use crate::assemble::SessionState;
use crate::config::Settings;
use crate::messages::{AssembledTurn, RetrievedTurn};
use crate::stage::{Output, Stage, StageError};
use crate::store::{StateRead, Store};

/// Builds the `/responses` body.
#[derive(Debug)]
pub struct Assemble {
    settings: Arc<Settings>,
    store: Store,
    mcp: Arc<crate::mcp::Hub>,
}

impl Assemble {
    /// The stage, using `deps`' settings, store and MCP servers (whose tools it offers).
    pub fn new(deps: &Deps) -> Self {
        Assemble {
            settings: deps.settings.clone(),
            store: deps.store.clone(),
            mcp: deps.mcp.clone(),
        }
    }
}

impl Stage for Assemble {
    const NAME: &'static str = "assemble";
    type In = RetrievedTurn;
    type Out = AssembledTurn;

    async fn run(&self, mut job: RetrievedTurn) -> Result<Output<AssembledTurn>, StageError> {
        // A round trip after tool results is where follow-ups that steer the turn join it.
        if job.admitted.continuation.is_some() {
            let key = &job.admitted.key;
            job.admitted.steers =
                self.store.steers_for(&key.session_id, key.turn_id.as_str()).await?;
        }
        // Corrupt state must not silently become an empty one: the message is dead-lettered
        // and the turn fails.
        let (read, session_state) =
            self.store.session_state_to_carry(&job.admitted.key.session_id).await?;
        let state = match read {
            StateRead::Typed(state) => state,
            StateRead::Stored(stored) => {
                SessionState::from_stored(stored).map_err(StageError::unusable)?
            }
        };
        let turn = job.admitted.user_turn().map_err(StageError::fail)?;
        let context =
            super::conversation_context(&self.settings, turn).map_err(StageError::fail)?;
        let mcp_tools = match &context.server_tools.mcp[..] {
            [] => Vec::new(),
            servers => self.mcp.tools(servers).await,
        };
        let assembled = job
            .admitted
            .assemble(&job.chunks, &state, (context, &mcp_tools), &self.settings.assemble)
            .map_err(StageError::fail)?;
        Ok(Output::Next(AssembledTurn {
            admitted: job.admitted,
            warnings: job.warnings,
            assembled,
            session_state,
        }))
    }
}
