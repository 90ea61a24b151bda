//! The call's reservation against its money budgets (docs/tenancy.md §7a), made before the call:
//! its worst case is the body's bytes plus the chain it continues as input tokens (a text token
//! is at least a byte) plus [`IMAGE_TOKENS`] per image (an image's tokens depend on its pixels,
//! not its bytes), and the context's `max_output_tokens` as output, priced from the price table.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Settings, Usd};
use crate::contracts::{ApiError, ErrorCode};
use crate::llm::RequestBody;
use crate::messages::AdmittedTurn;
use crate::stage::StageError;
use crate::store::{CallReservation, Exhausted, Store};

/// Longest a call waits for the calls in flight to settle when only their reservations keep it
/// from its budget.
const SETTLE_WAIT: Duration = Duration::from_secs(15);
/// How often it looks again meanwhile (each look is one short transaction under the budget's
/// lock).
const SETTLE_POLL: Duration = Duration::from_millis(500);
/// Input tokens one image may cost at most: the largest a Responses model bills for one image at
/// `detail: high` is under 6,000 (OpenAI's vision guide: 1,536 patches times the model's
/// multiplier, or 85 + 170 per 512-pixel tile), whatever the size of its bytes.
const IMAGE_TOKENS: u64 = 6_000;

/// What became of a call's reservation.
pub(super) enum Reserved {
    /// Reserved (the reservation's id), or no budget applies (`None`): the call may be made.
    /// A call under a reservation is not retried inside it after an attempt that may have
    /// been billed.
    Made {
        /// The reservation (`spend.id`).
        reservation: Option<i64>,
    },
    /// The call could pass a ceiling: the turn fails with this error.
    Refused(ApiError),
    /// The turn was cancelled while its call waited.
    Cancelled,
}

/// Reserves the call's worst case where a budget applies. When only other calls' reservations
/// are in the way (it fits once they settle), it waits for them, up to [`SETTLE_WAIT`]:
/// reservations are worst cases, and refusing then would refuse turns the budget can pay for.
pub(super) async fn reserve(
    settings: &Settings,
    store: &Store,
    job: &AdmittedTurn,
    body: &RequestBody,
    cancel: &CancellationToken,
) -> Result<Reserved, StageError> {
    if !settings.budgets_configured() {
        return Ok(Reserved::Made { reservation: None });
    }
    let turn = job.user_turn().map_err(StageError::fail)?;
    let context_id = turn
        .conversation_context_id()
        .map_or(settings.default_conversation_context.as_str(), |c| c.as_str());
    let tenant = job.tenant.as_ref().map(|t| (t, settings.limits_of(Some(t)).budget()));
    let context = settings.context_budget(context_id);
    if !context.is_set() && !tenant.is_some_and(|(_, b)| b.is_set()) {
        return Ok(Reserved::Made { reservation: None });
    }
    let worst = worst_case(settings, store, job, body, context_id).await?;
    let reservation = CallReservation {
        key: &job.key,
        step: job.step,
        tenant,
        context: (context_id, context),
        worst,
    };
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let exhausted = match store.reserve_call(&reservation).await? {
            Ok(id) => return Ok(Reserved::Made { reservation: Some(id) }),
            Err(e) => e,
        };
        if !exhausted.fits_once_settled(worst) || Instant::now() >= deadline {
            return Ok(Reserved::Refused(refusal(&exhausted, worst)));
        }
        tokio::select! {
            _ = tokio::time::sleep(SETTLE_POLL) => {}
            _ = cancel.cancelled() => return Ok(Reserved::Cancelled),
        }
    }
}

/// What the call can cost at most.
async fn worst_case(
    settings: &Settings,
    store: &Store,
    job: &AdmittedTurn,
    body: &RequestBody,
    context_id: &str,
) -> Result<Usd, StageError> {
    let head = body.head();
    let model = head.model.unwrap_or_default();
    // Both are required wherever a budget applies (checked at start).
    let price = settings.price_of(&model).ok_or_else(|| {
        StageError::unusable(format!("no price for model `{model}` under a budget"))
    })?;
    let cap = settings.conversation_contexts.get(context_id).and_then(|c| c.max_output_tokens);
    let output = head.max_output_tokens.map(|n| n.max(0) as u64).or(cap.map(u64::from));
    let output = output.ok_or_else(|| {
        StageError::unusable(format!(
            "no max_output_tokens for context `{context_id}` under a budget"
        ))
    })?;
    let chain = match &head.previous_response_id {
        Some(id) => store.chain_tokens(&job.key.session_id, id).await?,
        None => 0,
    };
    let text = body.as_str();
    let images = text.matches(r#""type":"input_image""#).count() as u64;
    let input = (text.len() as u64).saturating_add(chain).saturating_add(images * IMAGE_TOKENS);
    Ok(price.worst_case(input, output))
}

fn refusal(e: &Exhausted, worst: Usd) -> ApiError {
    ApiError::new(
        ErrorCode::LimitBudgetExhausted,
        format!(
            "{}'s budget of {} per {} has {} spent or reserved; this call could cost up to {}",
            e.scope,
            e.budget,
            e.period.as_str(),
            e.spent,
            worst
        ),
    )
}
