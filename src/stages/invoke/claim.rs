//! The claim on a round trip's provider call, as invoke holds it: taken before the call (or
//! waited for while a copy of the message holds it), renewed while the call runs, and given
//! up when the run ends without a saved answer, so the message's next attempt need not wait
//! out the lease. Saving the answer ends the claim in the database.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use crate::contracts::TurnKey;
use crate::store::{CallState, Store, StoreError, CLAIM_LEASE};

/// The first pause of a copy waiting for another's call, doubled up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);
/// How soon a renewal that failed is tried again.
const RETRY_RENEWAL: Duration = Duration::from_secs(1);

/// A claim this run holds, renewed in the background until dropped.
pub(super) struct Held {
    store: Store,
    key: TurnKey,
    step: i32,
    attempt: Uuid,
    renewal: JoinHandle<()>,
    lost: CancellationToken,
    stop: CancellationToken,
    answered: bool,
}

/// Where a round trip stands for this run, once no other attempt holds its call.
pub(super) enum Taken {
    /// The provider already answered: the saved answer.
    Answered(serde_json::Value),
    /// The turn no longer runs this step: a late copy.
    NotRunning,
    /// This run holds the call; `cancelled` when the turn's cancel was admitted.
    Held {
        /// Whether a cancel of the turn was admitted.
        cancelled: bool,
        /// The claim.
        held: Held,
    },
}

/// Where the round trip stands, claiming its call when it is still to be made. Waits while
/// another attempt holds the call: until its answer is saved, the turn stops running the step,
/// or its lease lapses and this run takes the call (a turn's cancel reaches the holder, which
/// ends its call and saves that ending). The claim's call stops when `cancel` fires.
pub(super) async fn take(
    store: &Store,
    key: &TurnKey,
    step: i32,
    cancel: &CancellationToken,
) -> Result<Taken, StoreError> {
    let attempt = Uuid::new_v4();
    let mut pause = FIRST_PAUSE;
    let mut waiting = false;
    loop {
        let state = store.claim_call(key, step, attempt).await?;
        match state {
            CallState { saved: Some(saved), .. } => return Ok(Taken::Answered(saved)),
            CallState { running: false, .. } => return Ok(Taken::NotRunning),
            CallState { claimed: true, cancelled, .. } => {
                let stop = cancel.child_token();
                let held = Held::renewed(store.clone(), key.clone(), step, attempt, stop);
                return Ok(Taken::Held { cancelled, held });
            }
            CallState { .. } => {}
        }
        if !waiting {
            info!(session = %key.session_id, turn = %key.turn_id, step, "another copy of this round trip is calling the provider; waiting for its answer");
            waiting = true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

impl Held {
    fn renewed(
        store: Store,
        key: TurnKey,
        step: i32,
        attempt: Uuid,
        stop: CancellationToken,
    ) -> Held {
        let lost = CancellationToken::new();
        let (s, k) = (store.clone(), key.clone());
        let renewal = tokio::spawn(keep_renewed(s, k, step, attempt, (lost.clone(), stop.clone())));
        Held { store, key, step, attempt, renewal, lost, stop, answered: false }
    }

    /// What stops the call: the turn's cancel, or a copy that took the call (this claim's
    /// lease lapsed unrenewed).
    pub(super) fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// Whether a copy took the call: this run gives way, and waits for the copy's answer as a
    /// copy would.
    pub(super) fn lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The answer is saved, which ended the claim: nothing to give up.
    pub(super) fn answered(mut self) {
        self.answered = true;
    }
}

/// Renews `attempt`'s claim every third of a lease until aborted. When a copy took the call,
/// or the round trip was answered or ended meanwhile, cancels `lost` and the call's `stop`:
/// a call made then would only be charged for.
async fn keep_renewed(
    s: Store,
    k: TurnKey,
    step: i32,
    attempt: Uuid,
    (lost, stop): (CancellationToken, CancellationToken),
) {
    let mut pause = CLAIM_LEASE / 3;
    let mut failing = false;
    loop {
        tokio::time::sleep(pause).await;
        let held = match s.renew_claim(&k, step, attempt).await {
            // Gone without a copy holding it (PostgreSQL crashed or failed over, which empties
            // an unlogged table): claimed again.
            Ok(false) => s.claim_call(&k, step, attempt).await.map(|state| state.claimed),
            renewed => renewed,
        };
        pause = match held {
            Ok(true) => {
                failing = false;
                CLAIM_LEASE / 3
            }
            Ok(false) => {
                info!(session = %k.session_id, turn = %k.turn_id, step, "claim on the provider call taken by a copy, or the round trip answered meanwhile; giving way");
                lost.cancel();
                stop.cancel();
                return;
            }
            // Tried again well within the lease: a copy takes the call only after it lapses,
            // so a short database outage must not cost the claim. Said once per outage.
            Err(error) => {
                if !failing {
                    warn!(session = %k.session_id, turn = %k.turn_id, step, %error, "claim on the provider call not renewed; trying again every second");
                }
                failing = true;
                RETRY_RENEWAL
            }
        };
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.renewal.abort();
        if self.answered {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (store, key, step, attempt) =
            (self.store.clone(), self.key.clone(), self.step, self.attempt);
        runtime.spawn(async move {
            if let Err(error) = store.release_claim(&key, step, attempt).await {
                // The lease lapses by itself: a copy waits for it, no longer.
                warn!(session = %key.session_id, turn = %key.turn_id, step, %error, "claim on the provider call not given up; it lapses");
            }
        });
    }
}
