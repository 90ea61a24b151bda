//! Publishing what a handler returned. A publish the broker refuses (a nack, an unroutable
//! message, a confirm that never came, a closed channel) is the broker's failure, not the
//! message's: an unordered message is nacked and redelivered, and an ordered one publishes the
//! same messages again where it stands, holding its lane, backing off from half a second to two.
//! Neither spends the stage's attempts, whose tiers are for the handler's own failures (a node
//! loss nacks publishes for seconds, which the tiers once stretched into a lane held 10 s and
//! more). An ordered message is given up only once the refusals have lasted as long as its
//! tiers would have: a fault that outlasts them (a deleted queue) is not an outage.

use std::time::{Duration, Instant};

use tracing::warn;

use super::{Settled, Settler};
use crate::broker::{BrokerError, Delivery, OutMessage, RETRY_TIERS_MS};

/// The first pause before an ordered message's refused publish is tried again.
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between two tries: a recovered broker is used within two seconds.
const LONGEST_PAUSE: Duration = Duration::from_secs(2);

impl Settler<'_> {
    /// Publishes `messages`, the outputs of `d`. `Ok(None)`: confirmed; `Ok(Some(end))`: the
    /// message ended otherwise (given up, or left to the broker on shutdown); `Err`: an
    /// unordered message's publish failed (the caller nacks it).
    pub(super) async fn forward(
        &self,
        d: &Delivery,
        messages: &[OutMessage],
        ordered: bool,
    ) -> Result<Option<Settled>, BrokerError> {
        let stage = self.stage.as_str();
        let mut refused: Option<(Instant, Duration)> = None;
        loop {
            let error = match self.publish(messages).await {
                Ok(()) => return Ok(None),
                // Never publishable: the turn ends here instead of retrying forever.
                Err(error @ BrokerError::TooLarge { .. }) => {
                    warn!(stage, %error, "output undeliverable, giving the message up");
                    self.give_up(d.clone(), format!("{}: {error}", super::super::UNDELIVERABLE))
                        .await?;
                    return Ok(Some(Settled::Done("dead_lettered")));
                }
                Err(error) if ordered => error,
                Err(error) => return Err(error),
            };
            // Every refused try counts: a lane held this way pages (alerts.yml).
            crate::metrics::metrics().message(stage, "publish_failed");
            let (since, pause) = refused.get_or_insert((Instant::now(), FIRST_PAUSE));
            if since.elapsed() >= self.tiers_last() {
                warn!(stage, %error, "publish refused as long as the retries last, giving the message up");
                let reason = format!("retries exhausted: publish failed: {error}");
                self.give_up(d.clone(), reason).await?;
                return Ok(Some(Settled::Done("dead_lettered")));
            }
            let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
            warn!(stage, %error, retry_in_ms, "publish failed, publishing again in place");
            if self.paused(*pause).await {
                return Ok(Some(Settled::Released));
            }
            *pause = (*pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// How long the stage's retry tiers last from its first attempt to its last.
    fn tiers_last(&self) -> Duration {
        let retries = self.settings.max_attempts.saturating_sub(1) as usize;
        let tier = |attempt: usize| RETRY_TIERS_MS[attempt.min(RETRY_TIERS_MS.len() - 1)];
        Duration::from_millis((0..retries).map(tier).sum())
    }
}
