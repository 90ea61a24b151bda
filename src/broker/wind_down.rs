//! How a stage lets go of one connection's consuming once it has ended.
//!
//! Ended cleanly (shutdown, a consume loop told to stop), in-flight messages settle and ack, then
//! the channel and both connections close politely, each close waiting for the broker's answer.
//! Ended by an error with the connection dead (a node lost, a connection reset), nothing waits
//! on the broker: its unacknowledged messages are already back in their queues, and a close sent
//! on a connection lapin has not yet marked broken would wait for an answer that never comes.
//! lapin marks a dead connection's channels broken one after another, so a stage woken by the
//! first one's error found the others still "connected" and waited 20 s to close them, holding
//! its ingress partitions all that time (docs/reliability.md, the cluster test's 20 s silences).
//! Ended by an error with the connection alive (only the publisher's lost, one channel ended),
//! it still closes in order, but waits at most `BROKEN_SETTLE` for each step.

use std::time::{Duration, Instant};

use lapin::{Channel, Connection};
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use super::settings::SETUP_TIMEOUT;
use super::{BrokerError, Publisher, StageName};

/// Longest a stage waits, once its connection broke, for its in-flight messages before it
/// reconnects: their in-place retries end with the connection, and whatever is left (a publish
/// waiting for its confirm) can no longer ack, so the broker delivers its message again.
pub(super) const BROKEN_SETTLE: Duration = Duration::from_secs(2);

/// What one connection's consuming left to let go of.
pub(super) struct Ended {
    pub stage: StageName,
    pub tracker: TaskTracker,
    pub conn: Connection,
    pub publisher: Publisher,
    /// The consuming channel, when it is closed only after its messages are settled.
    pub channel: Option<Channel>,
}

/// Whether the consuming connection is dead. lapin marks the connection broken before any of
/// its channels, so this holds as soon as a consumer has seen the error; a consuming that ended
/// otherwise (its publisher's connection lost, one partition's channel closed) leaves a live
/// connection, whose channels must still close before their consumers end.
pub(super) fn dead(conn: &Connection, outcome: &Result<(), BrokerError>) -> bool {
    outcome.is_err() && !conn.status().connected()
}

impl Ended {
    /// Lets go as `outcome` (the consuming's end) calls for, and returns it.
    pub(super) async fn wind_down(
        self,
        outcome: Result<(), BrokerError>,
    ) -> Result<(), BrokerError> {
        let Ended { stage, tracker, conn, publisher, channel } = self;
        let stage = stage.as_str();
        tracker.close();
        let Err(error) = &outcome else {
            tracker.wait().await;
            // Closing waits for the broker's answer; a broker that stopped answering must not
            // hold up the exit.
            let _ = tokio::time::timeout(SETUP_TIMEOUT, close(channel, &conn, &publisher)).await;
            return outcome;
        };
        let dead = dead(&conn, &outcome);
        info!(stage, %error, dead, "letting go of the broker connection");
        let since = Instant::now();
        // The wait bounds how long old and new work overlap, no more: what is still running
        // can no longer ack, and its message comes again as a copy.
        if tokio::time::timeout(BROKEN_SETTLE, tracker.wait()).await.is_err() {
            let waited_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
            warn!(stage, waited_ms, "in-flight messages still settling, reconnecting beside them");
        }
        if !dead {
            // Alive, it answers: closing returns what it held in order (`partitioned`).
            let _ = tokio::time::timeout(BROKEN_SETTLE, close(channel, &conn, &publisher)).await;
            return outcome;
        }
        // Dropped, lapin closes them without waiting; the publisher's connection may be alive
        // (only the consuming one died), so it is closed politely, in the background.
        drop((channel, conn));
        tokio::spawn(async move { publisher.close(SETUP_TIMEOUT).await });
        outcome
    }
}

async fn close(channel: Option<Channel>, conn: &Connection, publisher: &Publisher) {
    if let Some(channel) = channel {
        let _ = channel.close(200, "stage stopping".into()).await;
    }
    let _ = conn.close(200, "stage stopping".into()).await;
    publisher.close(SETUP_TIMEOUT).await;
}
