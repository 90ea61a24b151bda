//! Retrieve: an admitted turn in; the turn with its `[CONTEXT]` chunks out. Tool continuations
//! pass straight through (they carry tool outputs, not a new question), after the server tools
//! the last answer called have run here (`tools`: `search_code` needs this stage's store).

use std::sync::Arc;

use tracing::warn;

use super::Deps;
use crate::config::Settings;
use crate::contracts::{ArtifactContents, UserTurn, UserWarning};
use crate::messages::{AdmittedTurn, RetrievedTurn};
use crate::retrieve::{Retrieval, SearchRequest};
use crate::stage::{Cause, Output, Stage, StageError};
use crate::store::Store;

/// Warning code: retrieval failed for a reason retrying cannot fix; the turn ran without context.
pub const RETRIEVAL_UNAVAILABLE: &str = "retrieval.unavailable";

mod effects;
mod tools;

/// Fills the `[CONTEXT]` block from the vector store, and runs server tools.
#[derive(Debug)]
pub struct Retrieve {
    settings: Arc<Settings>,
    retrieval: Retrieval,
    store: Store,
    mcp: Arc<crate::mcp::Hub>,
}

impl Retrieve {
    /// The stage, using `deps`' settings, vector store and database (for produced files).
    pub fn new(deps: &Deps) -> Self {
        Retrieve {
            settings: deps.settings.clone(),
            retrieval: deps.retrieval.clone(),
            store: deps.store.clone(),
            mcp: deps.mcp.clone(),
        }
    }
}

impl Stage for Retrieve {
    const NAME: &'static str = "retrieve";
    type In = AdmittedTurn;
    type Out = RetrievedTurn;

    /// Opens every configured collection of the embedded store, so that a second process on
    /// the same directory stops at start, naming the fix (one retrieve process, or a server).
    async fn prepare(&self) -> Result<(), Cause> {
        if self.settings.vector.url.is_some() {
            return Ok(());
        }
        for agent in self.settings.agent_contexts.values() {
            self.retrieval.store(&agent.collection).await?;
        }
        Ok(())
    }

    async fn run(&self, job: AdmittedTurn) -> Result<Output<RetrievedTurn>, StageError> {
        let job =
            if job.server_calls.is_empty() { job } else { self.run_server_tools(job).await? };
        let turn = job.user_turn().map_err(StageError::fail)?;
        if job.continuation.is_some() {
            let warnings = job.carried_warnings.clone();
            return Ok(Output::Next(RetrievedTurn { admitted: job, chunks: vec![], warnings }));
        }
        let (context, agent) = match (
            super::conversation_context(&self.settings, turn),
            super::agent_context(&self.settings, turn),
        ) {
            (Ok(c), Ok(a)) => (c, a),
            (Err(e), _) | (_, Err(e)) => return Err(StageError::fail(e)),
        };
        let query = query_text(turn);
        let request = SearchRequest {
            collection: &agent.collection,
            query_text: &query,
            repo: turn.repo(),
            scope: turn.rag_scope(),
            top_k: context.top_k,
            budget_chars: context.chunk_budget_chars,
        };
        let (chunks, warnings) = match self.retrieval.search(request).await {
            Ok(found) => (found.chunks, found.warnings),
            Err(e) if e.is_retryable() => return Err(StageError::transient(e)),
            Err(e) => {
                warn!(session = %job.key.session_id, turn = %job.key.turn_id, error = %e, "retrieval failed; continuing without context");
                let warning = UserWarning {
                    code: RETRIEVAL_UNAVAILABLE.to_owned(),
                    message: "source context could not be retrieved for this turn; the answer may miss it"
                        .to_owned(),
                };
                (Vec::new(), vec![warning])
            }
        };
        Ok(Output::Next(RetrievedTurn { admitted: job, chunks, warnings }))
    }
}

/// What to search for: the instruction, else the names of the files sent with the turn.
fn query_text(turn: &UserTurn) -> String {
    if let Some(instruction) = turn.instruction() {
        return instruction.to_owned();
    }
    let mut parts: Vec<String> = turn.artifacts().iter().map(|a| a.path().to_string()).collect();
    // A small file's first lines name what it is about; they make a better query than its path.
    if let Some(ArtifactContents::Text(text)) = turn.artifacts().first().map(|a| a.contents()) {
        parts.push(text.lines().take(20).collect::<Vec<_>>().join("\n"));
    }
    parts.join("\n")
}
