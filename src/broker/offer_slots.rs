//! Places for offers to clients' queues, taken before a client's time to take its message
//! starts.
//!
//! A publish needs one of its publisher's channels, and waiting for one is the pipeline's own
//! wait: charged to the queue being offered to, it made a tenant whose queues confirm slowly
//! (holding every channel) look like other tenants' queues refusing, so their deltas were
//! dropped and their replies parked. Offers to clients' queues therefore hold at most
//! [`ALL_OFFERS`] of the channels (the rest stay for the stages' own publishes) and one tenant's
//! at most [`TENANT_OFFERS`] (a single-tenant deployment's clients share the places uncapped),
//! and the wait for a place is not the client queue's fault: an offer that gets none in time is
//! handed back without marking its queue as refusing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::contracts::TenantName;

/// Offers to clients' queues in flight at once on one publisher: below its channels
/// (`publish::MAX_CHANNELS`, 256), so the stages' own publishes always find one.
pub(super) const ALL_OFFERS: usize = 224;
/// One tenant's offers in flight at once on one publisher: seven tenants' slow queues are
/// needed to hold every place.
pub(super) const TENANT_OFFERS: usize = 32;

/// An offer's place; dropping it frees the place.
#[derive(Debug)]
pub(super) struct OfferSlot {
    _tenant: Option<OwnedSemaphorePermit>,
    _all: OwnedSemaphorePermit,
}

/// The places of one publisher.
#[derive(Debug)]
pub(super) struct OfferSlots {
    all: Arc<Semaphore>,
    /// Per tenant; tenants are the broker's users, a bounded set.
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
    per_tenant: usize,
}

impl Default for OfferSlots {
    fn default() -> Self {
        OfferSlots::new(ALL_OFFERS, TENANT_OFFERS)
    }
}

impl OfferSlots {
    fn new(all: usize, per_tenant: usize) -> Self {
        OfferSlots { all: Arc::new(Semaphore::new(all)), tenants: Mutex::default(), per_tenant }
    }

    /// A place for an offer of `tenant`'s (none: a single-tenant deployment, whose clients
    /// share the places with no cap of their own), waiting at most `wait`; `None` when none
    /// came.
    pub(super) async fn take(
        &self,
        tenant: Option<&TenantName>,
        wait: Duration,
    ) -> Option<OfferSlot> {
        let own = match tenant {
            Some(t) => {
                let mut tenants = self.tenants.lock().ok()?;
                let slots = tenants
                    .entry(t.as_str().to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant)));
                Some(slots.clone())
            }
            None => None,
        };
        let places = async {
            let tenant = match own {
                Some(own) => Some(own.acquire_owned().await.ok()?),
                None => None,
            };
            let all = self.all.clone().acquire_owned().await.ok()?;
            Some(OfferSlot { _tenant: tenant, _all: all })
        };
        tokio::time::timeout(wait, places).await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantName {
        name.parse().unwrap()
    }

    #[tokio::test]
    async fn one_tenants_offers_leave_places_for_anothers() {
        let slots = OfferSlots::new(6, 4);
        let wait = Duration::from_millis(50);
        let (a, b) = (tenant("acme"), tenant("globex"));
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(slots.take(Some(&a), wait).await.expect("a place for acme"));
        }
        // Acme's slow queues hold its four places: its next offer waits, another tenant's does
        // not, until every place is taken.
        assert!(slots.take(Some(&a), wait).await.is_none());
        held.push(slots.take(Some(&b), wait).await.expect("a place for globex"));
        held.push(slots.take(None, wait).await.expect("a place without a tenant"));
        assert!(slots.take(Some(&b), wait).await.is_none(), "all six places are held");
        held.truncate(3);
        assert!(slots.take(Some(&a), wait).await.is_some(), "a freed place is taken again");
        // Without tenants (one deployment's clients), only the places as a whole bound offers.
        let single = OfferSlots::new(6, 4);
        let mut all = Vec::new();
        for _ in 0..6 {
            all.push(single.take(None, wait).await.expect("a place"));
        }
        assert!(single.take(None, wait).await.is_none());
    }
}
