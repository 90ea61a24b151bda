//! The `--limit`: at most that many turns run in one invocation. A turn takes a place before its
//! inputs are read (a small limit over a large selection reads only the turns it runs), keeps
//! it when it runs and gives it back when it turns out not to (a steered turn, a context gone):
//! turns waiting meanwhile take the place given back, and once the limit's turns all ran the
//! rest are left at once.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Semaphore, SemaphorePermit};

/// The places of one invocation.
#[derive(Debug)]
pub(super) struct Places {
    /// `None`: no limit.
    places: Option<Semaphore>,
    limit: usize,
    kept: AtomicUsize,
}

/// One turn's place; dropped, it is given back.
#[derive(Debug)]
pub(super) struct Place<'a> {
    permit: Option<SemaphorePermit<'a>>,
    of: &'a Places,
}

impl Places {
    /// `limit` places, or as many as asked for.
    pub(super) fn new(limit: Option<usize>) -> Self {
        let limit = limit.map(|l| l.min(Semaphore::MAX_PERMITS));
        let places = limit.map(Semaphore::new);
        if limit == Some(0) {
            places.iter().for_each(Semaphore::close);
        }
        Places { places, limit: limit.unwrap_or(usize::MAX), kept: AtomicUsize::new(0) }
    }

    /// A place, waiting while others that may give theirs back hold them; `None` once the
    /// limit's turns have run.
    pub(super) async fn take(&self) -> Option<Place<'_>> {
        let permit = match &self.places {
            Some(places) => Some(places.acquire().await.ok()?),
            None => None,
        };
        Some(Place { permit, of: self })
    }
}

impl Place<'_> {
    /// The turn runs: the place is used for good.
    pub(super) fn keep(self) {
        let Some(permit) = self.permit else { return };
        permit.forget();
        if self.of.kept.fetch_add(1, Ordering::SeqCst) + 1 >= self.of.limit {
            if let Some(places) = &self.of.places {
                places.close();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_place_given_back_is_taken_and_the_limit_ends_the_waiting() {
        let places = Places::new(Some(1));
        let first = places.take().await.expect("a place");
        // Taken: the next turn waits; given back, it gets the place.
        let waiting = places.take();
        drop(first);
        let second = waiting.await.expect("the place given back");
        second.keep();
        assert!(places.take().await.is_none(), "one turn ran: the rest are left");
        assert!(Places::new(None).take().await.is_some());
        assert!(Places::new(Some(0)).take().await.is_none(), "--limit 0 runs nothing");
    }
}
