//! Publishing a delivery's outputs with confirms: replies and deltas to their client's queue
//! one after the other (what the client's queue refused is returned, to be parked), then the
//! messages to the pipeline's own queues at once, a stage queue's signed with the MAC.

use std::time::{Duration, Instant};

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

/// The longest one delivery spends offering its messages to clients' queues, all of them
/// together. Each offer is bounded (a place, then the client's queue's own time), but a
/// delivery can carry thousands (a resume sends a turn's kept events again): into a queue whose
/// confirms come slowly yet in time, they would hold the stage's slot and the session's lane
/// for hours. Past this, what is left is not offered: replies are parked, deltas dropped.
const CLIENTS_TIME: Duration = Duration::from_secs(10);

/// Why a reply left when the delivery's time for clients' queues ran out was not offered.
const OUT_OF_TIME: &str = "not offered: the delivery's time for clients' queues ran out";

/// Why a reply behind one its queue refused in the same delivery was not offered.
const BEHIND: &str = "behind a reply its queue refused";

/// Replies and deltas, one after the other; the replies refused (see [`publish_all`]).
pub(super) async fn publish_to_clients(
    publisher: &Publisher,
    settings: &RuntimeSettings,
    to_clients: &[&OutMessage],
) -> Result<Vec<Refused>, BrokerError> {
    let topology = &settings.topology;
    let queue_of = |m: &OutMessage| client_queue(topology, m).unwrap_or_default();
    let offer = |m| publish_one(publisher, settings, m);
    let refused = offer_in_turn(to_clients, CLIENTS_TIME, queue_of, offer).await?;
    let refused = refused.into_iter();
    Ok(refused.map(|(m, queue, reason)| Refused { message: m.clone(), queue, reason }).collect())
}

/// Offers each message with `offer`, in order, while `time` lasts from the first; returns the
/// replies refused or left, with their queue and why (deltas refused or left are dropped). A reply never
/// overtakes one refused before it: once its queue (`queue_of`) refused one, or the time is
/// out, what is left for it is refused without an offer, to be parked behind.
async fn offer_in_turn<'m, F, Fut>(
    to_clients: &[&'m OutMessage],
    time: Duration,
    queue_of: impl Fn(&OutMessage) -> String,
    mut offer: F,
) -> Result<Vec<(&'m OutMessage, String, String)>, BrokerError>
where
    F: FnMut(&'m OutMessage) -> Fut,
    Fut: std::future::Future<Output = Result<Handed, BrokerError>>,
{
    let until = Instant::now() + time;
    let mut refusing = std::collections::HashSet::new();
    let mut refused = Vec::new();
    for m in to_clients.iter().copied() {
        let queue = queue_of(m);
        let handed = if refusing.contains(&queue) {
            Handed::Refused(BEHIND.into())
        } else if Instant::now() < until {
            offer(m).await?
        } else {
            crate::metrics::metrics().message("reply", "client_time_out");
            Handed::Refused(OUT_OF_TIME.into())
        };
        if let Handed::Refused(reason) = handed {
            if m.kind == "delta" {
                crate::metrics::metrics().message("reply", "delta_dropped");
                continue;
            }
            refusing.insert(queue.clone());
            refused.push((m, queue, reason));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: &str, n: usize) -> OutMessage {
        OutMessage::to_queue("q".into(), kind, format!("m-{n}"), Vec::new())
    }

    /// Each test message's queue is its routing key.
    fn queue_of(m: &OutMessage) -> String {
        m.routing_key.clone()
    }

    /// Every offer takes 100 ms and is taken, like a queue whose confirms come slowly but in
    /// time: twenty of them would take 2 s; the time given is 250 ms.
    #[tokio::test]
    async fn a_slow_queue_gets_the_deliverys_time_and_the_rest_is_parked_in_order() {
        let kinds = ["delta", "reply", "delta", "reply"];
        let messages: Vec<OutMessage> = (0..20).map(|n| message(kinds[n % 4], n)).collect();
        let refs: Vec<&OutMessage> = messages.iter().collect();
        let offered = std::sync::Mutex::new(Vec::new());
        let started = Instant::now();
        let refused = offer_in_turn(&refs, Duration::from_millis(250), queue_of, |m| {
            offered.lock().unwrap().push(m.message_id.clone());
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(Handed::Done)
            }
        })
        .await
        .unwrap();
        let offered = offered.into_inner().unwrap();
        assert!((1..=4).contains(&offered.len()), "offered {offered:?}");
        assert!(started.elapsed() < Duration::from_millis(900), "took {:?}", started.elapsed());
        // Those not offered are the tail, in order: its replies refused, its deltas dropped.
        let expected: Vec<&str> = messages[offered.len()..]
            .iter()
            .filter(|m| m.kind == "reply")
            .map(|m| m.message_id.as_str())
            .collect();
        let ids: Vec<&str> = refused.iter().map(|(m, ..)| m.message_id.as_str()).collect();
        assert_eq!(ids, expected);
        assert_eq!(refused[0].2, OUT_OF_TIME);
        assert!(refused[1..].iter().all(|(.., why)| why == BEHIND), "{refused:?}");
        assert!(refused.iter().all(|(_, queue, _)| queue == "q"));
    }

    /// One delivery's replies to one queue (a resume's step replies): the second must not be
    /// taken while the first, refused for want of a place, waits parked.
    #[tokio::test]
    async fn a_reply_never_overtakes_one_its_queue_refused_and_refused_deltas_are_dropped() {
        let to = |queue: &str, kind: &str, n: usize| {
            OutMessage::to_queue(queue.into(), kind, format!("m-{n}"), Vec::new())
        };
        let messages = [
            to("q", "delta", 0),
            to("q", "reply", 1),
            to("q", "delta", 2),
            to("q", "reply", 3),
            to("other", "reply", 4),
            to("other", "delta", 5),
        ];
        let refs: Vec<&OutMessage> = messages.iter().collect();
        let offered = std::sync::Mutex::new(Vec::new());
        let refused = offer_in_turn(&refs, Duration::from_secs(10), queue_of, |m| {
            offered.lock().unwrap().push(m.message_id.clone());
            let handed = match m.message_id.as_str() {
                "m-1" => Handed::Refused("no place to offer it".into()),
                "m-5" => Handed::Refused("full".into()),
                _ => Handed::Done,
            };
            async { Ok(handed) }
        })
        .await
        .unwrap();
        let refused: Vec<(&str, &str)> =
            refused.iter().map(|(m, _, why)| (m.message_id.as_str(), why.as_str())).collect();
        assert_eq!(refused, [("m-1", "no place to offer it"), ("m-3", BEHIND)]);
        assert_eq!(offered.into_inner().unwrap(), ["m-0", "m-1", "m-4", "m-5"]);
    }
}
