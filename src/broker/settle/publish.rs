//! Publishing a delivery's outputs with confirms: replies and deltas to their client's queue
//! one after the other (what the client's queue refused is returned, to be parked), then the
//! messages to the pipeline's own queues at once, a stage queue's signed with the MAC.

use super::super::replies::{client_queue, Handed, Refused};
use super::super::settings::RuntimeSettings;
use super::super::{BrokerError, OutMessage, Publisher, MAC_HEADER};

/// Replies and deltas (to their client's queue), and the rest.
pub(super) fn by_destination(messages: &[OutMessage]) -> (Vec<&OutMessage>, Vec<&OutMessage>) {
    messages.iter().partition(|m| m.session.is_some() || m.instance.is_some())
}

/// Publishes with confirms. Replies and deltas go to their client's queue (see `replies`), one
/// after the other and before everything else: a turn's reply is in its queue before the
/// session's next turn (dispatched by the same commit) can produce one. Returns the replies
/// their client's queue refused, for the caller to park; refused deltas are dropped here.
pub async fn publish_all(
    publisher: &Publisher,
    settings: &RuntimeSettings,
    messages: &[OutMessage],
) -> Result<Vec<Refused>, BrokerError> {
    let (to_clients, rest) = by_destination(messages);
    let refused = publish_to_clients(publisher, settings, &to_clients).await?;
    publish_rest(publisher, settings, &rest).await?;
    Ok(refused)
}

/// Replies and deltas, one after the other; the replies refused (see [`publish_all`]).
pub(super) async fn publish_to_clients(
    publisher: &Publisher,
    settings: &RuntimeSettings,
    to_clients: &[&OutMessage],
) -> Result<Vec<Refused>, BrokerError> {
    let mut refused = Vec::new();
    for m in to_clients.iter().copied() {
        if let Handed::Refused(reason) = publish_one(publisher, settings, m).await? {
            if m.kind == "delta" {
                crate::metrics::metrics().message("reply", "delta_dropped");
                continue;
            }
            let queue = client_queue(&settings.topology, m).unwrap_or_default();
            refused.push(Refused { message: m.clone(), queue, reason });
        }
    }
    Ok(refused)
}

/// Messages to the pipeline's own queues, at once, each confirmed.
pub(super) async fn publish_rest(
    publisher: &Publisher,
    settings: &RuntimeSettings,
    rest: &[&OutMessage],
) -> Result<(), BrokerError> {
    let signed: Vec<std::borrow::Cow<'_, OutMessage>> =
        rest.iter().map(|m| signed(settings, m)).collect();
    let confirmed = signed.iter().map(|m| publish_one(publisher, settings, m));
    let results: Result<Vec<Handed>, BrokerError> =
        futures_util::future::join_all(confirmed).await.into_iter().collect();
    results.map(|_| ())
}

/// `m` with its MAC when it goes to a stage queue (and the process has keys).
fn signed<'a>(settings: &RuntimeSettings, m: &'a OutMessage) -> std::borrow::Cow<'a, OutMessage> {
    let Some(keys) = &settings.keys else { return std::borrow::Cow::Borrowed(m) };
    // The MAC names the stage's single queue, whichever partition carries the message: the
    // consumer checks it against the stage it is, not the queue it read.
    let Some(queue) = settings.topology.inner_stage_destination(&m.exchange, &m.routing_key) else {
        return std::borrow::Cow::Borrowed(m);
    };
    let mac = keys.sign(&super::super::stage_mac_fields(&m.kind, &queue), &m.body);
    std::borrow::Cow::Owned(m.clone().header(MAC_HEADER, mac))
}

async fn publish_one(
    publisher: &Publisher,
    settings: &RuntimeSettings,
    m: &OutMessage,
) -> Result<Handed, BrokerError> {
    let publish = publisher.sessions().publish(publisher, &settings.topology, m);
    // Declarations have no deadline of their own; a broker that stops answering must not hold
    // the message forever.
    let limit = settings.confirm_timeout * 3;
    tokio::time::timeout(limit, publish).await.unwrap_or(Err(BrokerError::ConfirmTimeout))
}
