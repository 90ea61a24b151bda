//! Which ingress partitions this validate worker consumes.
//!
//! Every worker announces itself in a roster once a second (PostgreSQL, `ingress_members`) and
//! reads back the live members; each computes the same even share from that list: partition
//! `i` goes to the `i mod N`-th member in sorted order. Balance is all this decides. Exclusive
//! consumption is the broker's: every partition queue has one active consumer, so while two
//! workers briefly both believe they own a partition, one of them only stands by, and the
//! worker that gives a partition up closes its channel only after its in-flight messages are
//! settled, so the next one continues exactly where it stopped.
//!
//! RabbitMQ 3.10 has no rebalancing of its own (a restarted worker never wins its single-active
//! partitions back; super streams need 3.11), hence this roster.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::store::StoreError;

/// How often a member announces itself and recomputes its share.
pub const BEAT: Duration = Duration::from_secs(1);

/// A member not heard from for this long is gone; its partitions are shared out.
pub const LIVE_FOR: Duration = Duration::from_secs(4);

/// The membership list, behind a trait so balance can be tested without a database.
#[async_trait::async_trait]
pub trait Roster: Send + Sync + 'static {
    /// Marks `member` alive; returns the live members, sorted.
    async fn beat(&self, group: &str, member: &str) -> Result<Vec<String>, StoreError>;
    /// Leaves the group.
    async fn leave(&self, group: &str, member: &str);
}

#[async_trait::async_trait]
impl Roster for crate::store::Store {
    async fn beat(&self, group: &str, member: &str) -> Result<Vec<String>, StoreError> {
        self.heartbeat(group, member, LIVE_FOR).await
    }

    async fn leave(&self, group: &str, member: &str) {
        if let Err(error) = crate::store::Store::leave(self, group, member).await {
            warn!(%error, member, "could not leave the ingress roster; others wait for it to expire");
        }
    }
}

/// The partitions of `0..partitions` that `me` consumes when `members` (sorted) are alive:
/// every `members.len()`-th one, starting at `me`'s place. Shares differ by at most one.
pub fn share(partitions: u16, members: &[String], me: &str) -> BTreeSet<u16> {
    let Some(at) = members.iter().position(|m| m == me) else { return BTreeSet::new() };
    (0..partitions).filter(|p| usize::from(*p) % members.len() == at).collect()
}

/// A name for a member: host, process and a random part, so copies in one process differ.
pub fn member_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &random[..8])
}

/// Keeps `member`'s share of `partitions` in the returned watch until `shutdown` fires, then
/// leaves the roster. While the roster cannot be read the share stays as it was: the broker
/// still keeps each partition with one consumer.
pub fn spawn(
    roster: std::sync::Arc<dyn Roster>,
    group: String,
    member: String,
    partitions: u16,
    shutdown: CancellationToken,
) -> watch::Receiver<BTreeSet<u16>> {
    let (tx, rx) = watch::channel(BTreeSet::new());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(BEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            match roster.beat(&group, &member).await {
                Ok(members) => {
                    let mine = share(partitions, &members, &member);
                    if *tx.borrow() != mine {
                        info!(member, members = members.len(), partitions = ?mine, "ingress share changed");
                        tx.send_replace(mine);
                    }
                }
                Err(error) => {
                    warn!(%error, member, "ingress roster unavailable, keeping the current share")
                }
            }
        }
        roster.leave(&group, &member).await;
    });
    rx
}
