//! Admitting a turn whose session's previous reply is still in the outbox. The reply was
//! published, and a client that answers at once has already read it, but its outbox row is
//! deleted only after the broker's confirm: a few milliseconds later. Admission must not let the
//! new turn overtake an unpublished reply: the store waits for the row for a moment (77 ms,
//! under the session's lock), then refuses (`ReplyInFlight`); trying again after short pauses
//! here spares such a turn the first retry tier (500 ms, holding its lane). A copy of the turn
//! admitted while this admission waited for the lock (`AdmittedMeanwhile`) is tried again the
//! same way: the next attempt finds the copy.

use std::future::Future;
use std::time::Duration;

use crate::store::StoreError;

/// Pauses between attempts, milliseconds: 77 ms in all before the retry tier takes over.
const PAUSES_MS: [u64; 5] = [2, 5, 10, 20, 40];

/// Runs `admit`, again after each pause while the previous reply is still in flight (or a copy
/// was admitted meanwhile).
pub(super) async fn admitting<T, F, Fut>(mut admit: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    for pause in PAUSES_MS {
        match admit().await {
            // A copy admitted meanwhile is found by the next attempt.
            Err(StoreError::ReplyInFlight | StoreError::AdmittedMeanwhile { .. }) => {
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            other => return other,
        }
    }
    admit().await
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real time (77 ms at most): a paused clock needs tokio's `test-util`, and that feature in
    // the dev dependencies alone would build every tokio crate twice (tests and binaries).
    #[tokio::test]
    async fn an_in_flight_reply_is_waited_for_briefly_then_left_to_the_retry_tier() {
        let mut calls = 0;
        let done = admitting(|| {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err(StoreError::ReplyInFlight)
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(done.unwrap(), 3);
        let mut calls = 0;
        let started = std::time::Instant::now();
        let gave_up: Result<(), _> = admitting(|| {
            calls += 1;
            async { Err(StoreError::ReplyInFlight) }
        })
        .await;
        assert!(matches!(gave_up, Err(StoreError::ReplyInFlight)));
        assert_eq!(calls, PAUSES_MS.len() + 1);
        assert!(started.elapsed() >= Duration::from_millis(PAUSES_MS.iter().sum()), "it paused");
    }
}
