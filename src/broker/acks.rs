//! Acks of one consuming channel, sent together: deliveries settled in the same pass of the
//! scheduler go out as one `basic.ack` with `multiple` set where every earlier delivery of the
//! channel is settled too, and one by one where one is not. Each ack still waits for what its
//! delivery's settling published to be confirmed (the caller acks only then); only the frame is
//! shared. A multiple ack never reaches past a delivery that is not known to be settled: one
//! still running, left unacked for the channel's close, nacked but not yet sent, or not yet taken
//! from the consumer (a channel's consumers share its tags, and their streams are merged in no
//! particular order).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lapin::options::BasicAckOptions;
use lapin::Acker;
use tokio::sync::{mpsc, oneshot};

/// The acks of one channel (its delivery tags start at 1 and count up). Its frames are sent by
/// the task [`AckBatch::new`] returns, which ends once every handle is dropped.
#[derive(Debug, Clone)]
pub struct AckBatch {
    state: Arc<Mutex<State>>,
    /// Wakes the sending task; its end tells the task no handle is left.
    wake: mpsc::Sender<()>,
    frames: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct State {
    /// Every tag up to this one was taken from the consumer.
    seen_through: u64,
    /// Tags taken above `seen_through`, with a gap below them.
    seen_above: BTreeSet<u64>,
    /// Taken and not yet settled.
    unsettled: BTreeSet<u64>,
    /// Settled, waiting for the next frame. A tag leaves `unsettled` and joins this under one
    /// lock, so a multiple ack reaches a tag only in the frame that answers it.
    waiting: Vec<Waiting>,
}

#[derive(Debug)]
struct Waiting {
    tag: u64,
    acker: Acker,
    done: oneshot::Sender<Result<(), String>>,
}

impl State {
    fn seen(&mut self, tag: u64) {
        if tag <= self.seen_through {
            return;
        }
        self.seen_above.insert(tag);
        while self.seen_above.remove(&(self.seen_through + 1)) {
            self.seen_through += 1;
        }
    }

    /// The lowest tag a multiple ack must not reach: the first unsettled or unseen one. It never
    /// goes down: a tag taken later is above every tag seen through.
    fn cut(&self) -> u64 {
        let unseen = self.seen_through + 1;
        self.unsettled.first().map_or(unseen, |&u| u.min(unseen))
    }
}

impl AckBatch {
    /// A batch, and the task that sends its frames (to be spawned).
    pub fn new() -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (wake, woken) = mpsc::channel(1);
        let batch = AckBatch { state: Arc::default(), wake, frames: Arc::new(AtomicU64::new(0)) };
        let sender = Sender { state: batch.state.clone(), frames: batch.frames.clone() };
        (batch, sender.run(woken))
    }

    /// A delivery taken from the consumer, to be settled.
    pub fn taken(&self, tag: u64) {
        let mut state = self.lock();
        state.seen(tag);
        state.unsettled.insert(tag);
    }

    /// A delivery settled without an ack of this batch (a nack, once sent): later multiple
    /// acks may reach past it.
    pub fn settled_otherwise(&self, tag: u64) {
        self.lock().unsettled.remove(&tag);
    }

    /// Acks `tag` in a frame shared with the acks settled meanwhile; `Err` with the reason
    /// when the frame could not be sent (the broker then redelivers).
    pub async fn ack(&self, tag: u64, acker: &Acker) -> Result<(), String> {
        let (done, wait) = oneshot::channel();
        {
            let mut state = self.lock();
            state.unsettled.remove(&tag);
            state.waiting.push(Waiting { tag, acker: acker.clone(), done });
        }
        // Full: a wake-up is pending already, and it takes this ack too.
        let _ = self.wake.try_send(());
        wait.await.unwrap_or_else(|_| Err("ack dropped".into()))
    }

    /// How many ack frames this batch has sent.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The task sending a batch's frames.
struct Sender {
    state: Arc<Mutex<State>>,
    frames: Arc<AtomicU64>,
}

impl Sender {
    /// Sends what waits on each wake-up, after one pass of the scheduler so that the acks
    /// settled in it go in the same frame; ends when no handle is left.
    async fn run(self, mut woken: mpsc::Receiver<()>) {
        while woken.recv().await.is_some() {
            tokio::task::yield_now().await;
            let (mut batch, cut) = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                (std::mem::take(&mut state.waiting), state.cut())
            };
            batch.sort_by_key(|w| w.tag);
            let rest = batch.split_off(batch.partition_point(|w| w.tag < cut));
            self.send(batch, true).await;
            self.send(rest, false).await;
        }
    }

    /// Acks `batch` (ascending): in one frame if `together` (everything below its last tag
    /// is settled), else one frame each.
    async fn send(&self, batch: Vec<Waiting>, together: bool) {
        if batch.is_empty() {
            return;
        }
        if together && batch.len() > 1 {
            let sent = self.frame(&batch[batch.len() - 1].acker, true).await;
            for w in batch {
                let _ = w.done.send(sent.clone());
            }
            return;
        }
        let frames = batch.iter().map(|w| self.frame(&w.acker, false));
        let sent = futures_util::future::join_all(frames).await;
        for (w, sent) in batch.into_iter().zip(sent) {
            let _ = w.done.send(sent);
        }
    }

    async fn frame(&self, acker: &Acker, multiple: bool) -> Result<(), String> {
        self.frames.fetch_add(1, Ordering::Relaxed);
        ack_frame(acker, multiple).await
    }
}

async fn ack_frame(acker: &Acker, multiple: bool) -> Result<(), String> {
    crate::metrics::metrics().amqp("basic.ack");
    match acker.ack(BasicAckOptions { multiple }).await {
        Ok(true) => Ok(()),
        Ok(false) => Err("channel closed".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// How one delivery is settled with the broker: alone, or in its channel's batch.
#[derive(Debug, Clone)]
pub(super) struct Settle {
    acker: Acker,
    batch: Option<(AckBatch, u64)>,
}

impl Settle {
    /// `d`'s settling, in `batch` if given (which is told it was taken).
    pub(super) fn of(d: &lapin::message::Delivery, batch: Option<&AckBatch>) -> Self {
        let batch = batch.map(|b| {
            b.taken(d.delivery_tag);
            (b.clone(), d.delivery_tag)
        });
        Settle { acker: d.acker.clone(), batch }
    }

    /// Acks the delivery; `Err` with the reason when the ack could not be sent.
    pub(super) async fn ack(&self) -> Result<(), String> {
        match &self.batch {
            Some((batch, tag)) => batch.ack(*tag, &self.acker).await,
            None => ack_frame(&self.acker, false).await,
        }
    }

    /// Nacks the delivery, requeueing it.
    pub(super) async fn nack(&self) {
        crate::metrics::metrics().amqp("basic.nack");
        let requeue = lapin::options::BasicNackOptions { requeue: true, ..Default::default() };
        let _ = self.acker.nack(requeue).await;
        // Only once the nack is sent: a multiple ack sent before it would take the message.
        if let Some((batch, tag)) = &self.batch {
            batch.settled_otherwise(*tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::State;

    #[test]
    fn a_multiple_ack_stops_at_the_first_unsettled_or_unseen_tag() {
        let mut s = State::default();
        for tag in [1, 2, 4] {
            s.seen(tag);
            s.unsettled.insert(tag);
        }
        // 3 not yet taken from its consumer: nothing at or past it.
        s.unsettled.remove(&1);
        s.unsettled.remove(&4);
        assert_eq!(s.cut(), 2);
        s.unsettled.remove(&2);
        assert_eq!(s.cut(), 3);
        s.seen(3);
        s.unsettled.insert(3);
        assert_eq!((s.seen_through, s.cut()), (4, 3));
        s.unsettled.remove(&3);
        assert_eq!(s.cut(), 5);
    }
}
