//! The pipeline, in order, in one place: [`chain`] is the registry. Each stage is one type in
//! its own file implementing [`Stage`](crate::stage::Stage); none names another, and none
//! sees the broker. [`Deps`] is what a process offers the stages it builds.

pub mod admit;
pub mod assemble;
pub mod invoke;
pub mod persist;
pub mod retrieve;

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::broker::{StageName, Topology};
use crate::config::{AgentContext, ConversationContext, Settings};
use crate::contracts::{ApiError, ErrorCode, UserTurn};
use crate::llm::LlmClient;
use crate::retrieve::Retrieval;
use crate::stage::{Chain, Context, DeltaSink, Ledger};
use crate::store::{Store, StoreError};

/// The registry: every stage of the pipeline, in order. A stage added here (and given its
/// queue by the deploy files) is part of the pipeline; the compiler checks that each stage
/// consumes what the one before it produces.
pub fn chain() -> Chain<Deps> {
    Chain::ingress(admit::Admit::new)
        .then(retrieve::Retrieve::new)
        .then(assemble::Assemble::new)
        .then(invoke::Invoke::new)
        .finish(persist::Persist::new)
}

/// The pipeline's stage names, in order.
pub fn names() -> Vec<StageName> {
    chain().names()
}

/// What the stages of one process may use. Built once per process and shared; each stage
/// takes what it needs when it is built.
#[derive(Debug, Clone)]
pub struct Deps {
    /// Validated configuration.
    pub settings: Arc<Settings>,
    /// PostgreSQL.
    pub store: Store,
    /// Queue names.
    pub topology: Topology,
    /// The vector store(s).
    pub retrieval: Retrieval,
    /// The LLM.
    pub llm: Arc<dyn LlmClient>,
    /// Where stream deltas go, when streaming is wired.
    pub deltas: Option<Arc<dyn DeltaSink>>,
    /// The MCP servers of the contexts, as this process reaches them.
    pub mcp: Arc<crate::mcp::Hub>,
}

impl Context for Deps {
    fn topology(&self) -> Topology {
        self.topology.clone()
    }

    fn ledger(&self) -> Arc<dyn Ledger> {
        Arc::new(self.store.clone())
    }
}

impl Ledger for Store {
    fn delete_outbox(&self, ids: Vec<i64>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { Store::delete_outbox(self, &ids).await })
    }

    fn count_redelivery(&self, key: String) -> BoxFuture<'_, Result<u32, StoreError>> {
        Box::pin(async move { Store::count_redelivery(self, &key).await })
    }

    fn park(&self, replies: Vec<crate::store::ParkReply>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let over = self.park_replies(&replies).await?;
            if over > 0 {
                tracing::warn!(
                    replies = over,
                    limit = crate::store::MAX_PARKED_PER_QUEUE,
                    "client queue holds too many waiting replies; these stay in PostgreSQL only"
                );
            }
            Ok(())
        })
    }
}

/// The ConversationContext of a user turn.
pub fn conversation_context<'a>(
    settings: &'a Settings,
    turn: &UserTurn,
) -> Result<&'a ConversationContext, ApiError> {
    let id = turn.conversation_context_id();
    settings.conversation_context(id).ok_or_else(|| {
        let name = id.map_or("(default)", |c| c.as_str());
        ApiError::at(
            ErrorCode::UnknownConversationContext,
            "ConversationContextId",
            format!("no conversation context `{name}` is configured"),
        )
    })
}

/// The AgentContext of a user turn.
pub fn agent_context<'a>(
    settings: &'a Settings,
    turn: &UserTurn,
) -> Result<&'a AgentContext, ApiError> {
    let id = turn.agent_context_id();
    settings.agent_context(id).ok_or_else(|| {
        let name = id.map_or("(default)", |c| c.as_str());
        ApiError::at(
            ErrorCode::UnknownAgentContext,
            "AgentContextId",
            format!("no agent context `{name}` is configured"),
        )
    })
}
