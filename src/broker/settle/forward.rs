//! Publishing what a handler returned. A publish the broker refuses (a nack, an unroutable
//! message, a confirm that never came, a closed channel) is the broker's failure, not the
//! message's: an unordered message is nacked and redelivered, and an ordered one publishes the
//! same messages again where it stands, holding its lane, backing off from half a second to two.
//! Neither spends the stage's attempts, whose tiers are for the handler's own failures (a node
//! loss nacks publishes for seconds, which the tiers once stretched into a lane held 10 s and
//! more). An ordered message is given up only once the refusals have lasted as long as its
//! tiers would have: a fault that outlasts them (a deleted queue) is not an outage. What giving
//! up publishes (an error reply, a dead letter) is held the same way, with no limit: there is
//! nothing left to fall back on.

use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::{Settled, Settler};
use crate::broker::{BrokerError, Delivery, OutMessage};

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
        let published = if ordered {
            self.publish_held(messages, self.tiers_last()).await
        } else {
            self.publish(messages).await
        };
        let error = match published {
            Ok(()) => return Ok(None),
            Err(error) if ordered && self.shutdown.is_cancelled() => {
                debug!(stage = self.stage.as_str(), %error, "stopping with a publish refused");
                return Ok(Some(Settled::Released));
            }
            Err(error) => error,
        };
        let reason = match &error {
            // Never publishable: the turn ends here instead of retrying forever.
            BrokerError::TooLarge { .. } => format!("{}: {error}", super::super::UNDELIVERABLE),
            _ if ordered => format!("retries exhausted: publish failed: {error}"),
            _ => return Err(error),
        };
        warn!(stage = self.stage.as_str(), %error, "output not published, giving the message up");
        self.give_up(d.clone(), reason).await?;
        Ok(Some(Settled::Done("dead_lettered")))
    }

    /// Publishes `messages` for an ordered message, holding its lane: a refused publish is tried
    /// again, backing off, until it is confirmed, `limit` has passed since the first refusal, or
    /// the worker stops (or its connection ends); then the last refusal is returned. Messages
    /// too large for the broker are never tried again.
    pub(super) async fn publish_held(
        &self,
        messages: &[OutMessage],
        limit: Duration,
    ) -> Result<(), BrokerError> {
        let stage = self.stage.as_str();
        let (since, mut pause) = (Instant::now(), FIRST_PAUSE);
        let mut part = super::ClientsPart::default();
        loop {
            let error = match self.publish_from(messages, &mut part).await {
                Err(error) if !matches!(error, BrokerError::TooLarge { .. }) => error,
                other => return other,
            };
            // Every refused try counts: a lane held this way pages (alerts.yml).
            crate::metrics::metrics().message(stage, "publish_failed");
            // A database that cannot park refused replies spends no try: the turn is not the
            // one failing, and giving it up would lose them (`Settler::park` waited already).
            let parking = matches!(error, BrokerError::NotParked(_));
            if since.elapsed() >= limit && !parking {
                return Err(error);
            }
            let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
            warn!(stage, %error, retry_in_ms, "publish failed, publishing again in place");
            if self.paused(pause).await {
                return Err(error);
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// How long the stage's retry tiers last from its first attempt to its last.
    fn tiers_last(&self) -> Duration {
        let retries = self.settings.max_attempts.saturating_sub(1);
        Duration::from_millis((0..retries).map(crate::broker::retry_tier_ms).sum())
    }
}
