//! Giving a message up: its handler's fallback messages (an error reply) and a dead letter
//! that keeps what an operator needs to replay it. `settle` decides when; this builds and
//! publishes what giving up sends.

use std::time::Duration;

use futures_util::FutureExt as _;

use tracing::{error, warn};

use super::{Settled, Settler};
use crate::broker::{BrokerError, Delivery, OutMessage};
use crate::contracts::{headers, TenantName};

/// How much of a dead letter's body is kept when the body names no session (64 KiB).
pub(super) const UNROUTABLE_BODY_KEPT: usize = 64 * 1024;

impl Settler<'_> {
    /// A message whose consumers died `count` times: given up as poison.
    pub(super) async fn poison(&self, d: Delivery, count: u32) -> Result<Settled, BrokerError> {
        warn!(stage = self.stage.as_str(), count, "dead-lettering poison message");
        self.give_up(d, format!("poison: delivered to a consumer that died {count} times")).await?;
        Ok(Settled::Done("dead_lettered"))
    }

    /// The turn ends here: the handler's fallback messages (an error reply) and a dead letter.
    /// A handler whose giving up panics (a stage's own ending is caught by its runner; this is
    /// what is left, decoding say) gives up with no messages of its own: the dead letter still
    /// goes, or the message would come back to panic again for ever on a queue with no delivery
    /// limit.
    pub(super) async fn give_up(&self, d: Delivery, reason: String) -> Result<(), BrokerError> {
        let exhausted = self.handler.exhausted(d.clone(), reason.clone());
        let messages = match std::panic::AssertUnwindSafe(exhausted).catch_unwind().await {
            Ok(messages) => messages,
            Err(_) => {
                error!(stage = self.stage.as_str(), %reason, "giving a message up panicked: dead-lettered without its error reply");
                crate::metrics::metrics().message(self.stage.as_str(), "panicked");
                Vec::new()
            }
        };
        self.dead_letter_with(&d, &reason, messages).await
    }

    /// Publishes the dead letter of `d` to its tenant's dead-letter queue (made by its first
    /// letter), then `messages`: by the time a client reads its error reply, the letter an
    /// operator looks for is there. An ordered message's messages are held in place until they
    /// go (see `forward`), as running its handler again could only give it up again. Messages
    /// the broker can never take (too large) are dropped with an error log rather than retried
    /// forever: the dead letter, the original body the broker already accepted once, went.
    pub(super) async fn dead_letter_with(
        &self,
        d: &Delivery,
        reason: &str,
        messages: Vec<OutMessage>,
    ) -> Result<(), BrokerError> {
        let dead = self.dead_letter(d, reason);
        self.publisher.publish_to_sink(&self.settings.topology, &dead).await?;
        let published = if self.handler.ordering_key(d).is_some() {
            self.publish_held(&messages, Duration::MAX).await
        } else {
            self.publish(&messages).await
        };
        match published {
            Err(error @ BrokerError::TooLarge { .. }) => {
                error!(stage = self.stage.as_str(), %error, %reason, "fallback messages undeliverable, dead-lettered alone");
                Ok(())
            }
            other => other,
        }
    }

    /// The tenant whose dead-letter queue keeps `d`: only a message the pipeline can vouch for
    /// is filed under the tenant it names; anything else goes to the shared queue.
    fn tenant_of(&self, d: &Delivery) -> Option<TenantName> {
        if self.untrusted(d).is_some() {
            return None;
        }
        self.handler.tenant(d)
    }

    fn dead_letter(&self, d: &Delivery, reason: &str) -> OutMessage {
        let id = d.message_id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let ingress = self.settings.topology.is_ingress(self.stage);
        // A client's message that names no session can never be replayed (nothing says where
        // it goes): its head is evidence enough, and a flood of large ones cannot push every
        // other dead letter out of the bounded queue.
        let unroutable = ingress && d.hint.session.is_none();
        let kept = if unroutable { d.body.len().min(UNROUTABLE_BODY_KEPT) } else { d.body.len() };
        let tenant = self.tenant_of(d);
        let mut msg = OutMessage::to_queue(
            self.settings.topology.dead_of(tenant.as_ref()),
            "dead",
            id,
            d.body[..kept].to_vec(),
        );
        // The broker's death records of the hops before (a delay queue's expiry) are not this
        // death: the letter is described from what the pipeline writes below.
        msg.headers = d
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with("x-first-death-") && !k.starts_with("x-last-death-"))
            .map(|(k, v)| (k.clone(), v.as_str().into()))
            .collect();
        msg.headers.remove(headers::KIND);
        // The copy is the worker's publish: keep who published the original (its tenant).
        if let Some(user) = &d.user_id {
            msg = msg.header(headers::USER_ID, user.as_str());
        }
        if let Some(to) = d.reply_to.as_deref().filter(|_| ingress) {
            msg = msg.header(headers::REPLY_TO, to);
        }
        if kept < d.body.len() {
            msg = msg.header(headers::BODY_BYTES, d.body.len() as u64);
        }
        // A replay must send it as what it was (a cancel is told from a request by its type);
        // a client's request may have none.
        let kind = d.kind.as_deref().filter(|k| !k.is_empty());
        let kind = kind.unwrap_or(if ingress { "request" } else { "turn" });
        msg = msg.header(headers::ORIGINAL_TYPE, kind);
        msg.header(headers::REASON, reason)
            .header(headers::STAGE, self.stage.as_str())
            .header(headers::ORIGINAL_QUEUE, self.queue())
    }
}
