//! Handing deliveries to tasks: per-key FIFO lanes (a session's messages one after another),
//! bounded concurrency, and per-partition in-flight counts for a clean hand-over.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::FutureExt as _;
use lapin::Acker;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::delivery::detach;
use super::settle::Settler;
use super::{Delivery, Handler, Publisher, RuntimeSettings, StageName};

/// A delivery detached from the consumer, with what is needed to settle it.
pub(super) struct Job {
    acker: Acker,
    delivery: Delivery,
    /// Counts the job as in flight on its partition until it is settled (dropped).
    _in_flight: Option<InFlightGuard>,
}

impl Job {
    /// Detaches `d` from its consumer; `in_flight` counts it on its partition.
    pub(super) fn new(
        mut d: lapin::message::Delivery,
        ingress: bool,
        worker: &Worker,
        in_flight: Option<&Arc<InFlight>>,
    ) -> Self {
        let keys = worker.settings.keys.as_ref();
        let delivery = detach(&mut d, ingress, keys, worker.handler.as_ref());
        Job { acker: d.acker, delivery, _in_flight: in_flight.map(InFlight::enter) }
    }
}

/// Messages of one partition taken from the broker and not yet settled.
#[derive(Default)]
pub(super) struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

impl InFlight {
    fn enter(this: &Arc<Self>) -> InFlightGuard {
        this.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(this.clone())
    }

    /// Waits until every message counted so far is settled.
    pub(super) async fn settled(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

pub(super) struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// What handling a job needs; cheap to clone.
#[derive(Clone)]
pub(super) struct Worker {
    pub(super) stage: StageName,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) publisher: Publisher,
    pub(super) settings: RuntimeSettings,
    pub(super) permits: Arc<Semaphore>,
    pub(super) shutdown: CancellationToken,
}

impl Worker {
    pub(super) fn new(
        stage: StageName,
        handler: &Arc<dyn Handler>,
        publisher: &Publisher,
        settings: &RuntimeSettings,
        shutdown: &CancellationToken,
    ) -> Self {
        Worker {
            stage,
            handler: handler.clone(),
            publisher: publisher.clone(),
            settings: settings.clone(),
            permits: Arc::new(Semaphore::new(usize::from(settings.prefetch.max(1)))),
            shutdown: shutdown.clone(),
        }
    }

    async fn settle(&self, job: Job) {
        // The semaphore mirrors prefetch; it only matters if the broker over-delivers.
        let Ok(_permit) = self.permits.acquire().await else { return };
        let settler = Settler {
            stage: self.stage,
            handler: &*self.handler,
            publisher: &self.publisher,
            settings: &self.settings,
            shutdown: &self.shutdown,
        };
        // An ordered message's copy, to handle again where it stands should its handling panic.
        let ordered = self.handler.ordering_key(&job.delivery).is_some();
        let mut again = ordered.then(|| job.delivery.clone());
        let mut settled = settler.settle(job.delivery, &job.acker);
        // A bug met while handling a message. Unacked, it would hold its prefetch slot (and its
        // session's lane, whose task would end with it) until the worker restarts.
        for panics in 1u32.. {
            if AssertUnwindSafe(settled).catch_unwind().await.is_ok() {
                return;
            }
            let stage = self.stage.as_str();
            tracing::error!(stage, panics, "handling a message panicked");
            crate::metrics::metrics().message(stage, "panicked");
            match again.take() {
                // Handled again in place as a redelivery (counted, given up as poison past the
                // limit): a nack would return it behind the next message of its session, which
                // this lane already holds.
                Some(mut d) if panics <= self.settings.max_redeliveries.saturating_add(1) => {
                    d.redelivered = true;
                    again = Some(d.clone());
                    settled = settler.settle(d, &job.acker);
                }
                // Returned as if its worker had died: redelivered, counted, given up.
                _ => {
                    let requeue =
                        lapin::options::BasicNackOptions { requeue: true, ..Default::default() };
                    let _ = job.acker.nack(requeue).await;
                    return;
                }
            }
        }
    }
}

/// Per-key FIFO lanes: one task per busy key drains that key's jobs in delivery order.
#[derive(Default)]
pub(super) struct Ordered {
    lanes: HashMap<String, Arc<std::sync::Mutex<Lane>>>,
}

#[derive(Default)]
struct Lane {
    queue: VecDeque<Job>,
    running: bool,
}

impl Ordered {
    /// Runs `job` now, or after the jobs before it with the same ordering key.
    pub(super) fn route(&mut self, job: Job, worker: &Worker, tracker: &TaskTracker) {
        let worker = worker.clone();
        match worker.handler.ordering_key(&job.delivery) {
            Some(key) => self.dispatch(key, job, worker, tracker),
            None => {
                tracker.spawn(async move { worker.settle(job).await });
            }
        }
    }

    fn dispatch(&mut self, key: String, job: Job, worker: Worker, tracker: &TaskTracker) {
        // Idle lanes are dropped so the map only holds keys with work.
        self.lanes.retain(|_, lane| {
            lane.lock().map(|l| l.running || !l.queue.is_empty()).unwrap_or(false)
        });
        let lane = self.lanes.entry(key).or_default().clone();
        let Ok(mut state) = lane.lock() else { return };
        state.queue.push_back(job);
        if state.running {
            return;
        }
        state.running = true;
        drop(state);
        tracker.spawn(async move {
            loop {
                // Taking a job and deciding to stop happen under the same lock as `dispatch`,
                // so no job is left behind in a lane without a task.
                let next = match lane.lock() {
                    Ok(mut l) => match l.queue.pop_front() {
                        Some(job) => job,
                        None => {
                            l.running = false;
                            return;
                        }
                    },
                    Err(_) => return,
                };
                if worker.shutdown.is_cancelled() {
                    // The job before this one may have gone back to the broker unfinished;
                    // handling this one now would overtake it. Left unacked, it returns with the
                    // channel's close in delivery order, which a nack now would not keep.
                    drop(next);
                    continue;
                }
                worker.settle(next).await;
            }
        });
    }
}
