//! Fault injection and latency: what the simulator does wrong, and how slowly, on purpose.
//!
//! Faults are armed two ways: "the next N requests" (a FIFO queue, consumed one per request)
//! and "each request with probability p". Queued faults win over random ones. When nothing is
//! armed the per-request check is one atomic load.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One injected failure. Read strictly (unknown kinds and fields are refused), see `control`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", try_from = "FaultWire")]
pub enum Fault {
    /// 429 `rate_limit_exceeded`, with `retry-after-ms` and/or `Retry-After` (seconds) headers.
    RateLimit {
        /// `retry-after-ms` header value.
        #[serde(default)]
        retry_after_ms: Option<u64>,
        /// `Retry-After` header value, seconds.
        #[serde(default)]
        retry_after_secs: Option<u64>,
    },
    /// 429 `insufficient_quota` (never retried by a correct client).
    InsufficientQuota,
    /// 500 `server_error`.
    ServerError,
    /// Any status with the API's usual body for it (e.g. 400, 401, 403, 404, 408, 409, 503).
    Status {
        /// The HTTP status.
        status: u16,
    },
    /// Accept the request and never answer (until the simulator's hang limit or shutdown).
    Hang,
    /// Drop the connection without a usable answer.
    Disconnect,
    /// Send the first `after_events` stream events, then break the connection (a non-streaming
    /// answer is cut halfway instead).
    StreamCut {
        /// Events sent before the cut.
        after_events: usize,
    },
    /// Send the first `after_events` stream events, then go silent (a non-streaming answer hangs).
    StreamStall {
        /// Events sent before the silence.
        after_events: usize,
    },
}

#[derive(Debug, Default)]
struct Armed {
    queue: VecDeque<Fault>,
    random: Vec<(Fault, f64)>,
}

/// The armed faults. Shared by the handle and the request handlers.
#[derive(Debug, Default)]
pub struct FaultPlan {
    armed: AtomicBool,
    inner: Mutex<Armed>,
}

impl FaultPlan {
    fn with<R>(&self, f: impl FnOnce(&mut Armed) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut guard);
        self.armed.store(!guard.queue.is_empty() || !guard.random.is_empty(), Ordering::Release);
        r
    }

    /// The next `count` requests get `fault` (after any already queued).
    pub fn fail_next(&self, fault: Fault, count: usize) {
        self.with(|a| a.queue.extend(std::iter::repeat_n(fault, count)));
    }

    /// Each request gets `fault` with `probability` (0-1), replacing an earlier probability for
    /// the same fault; 0 removes it. The probabilities of different faults add up.
    pub fn fail_randomly(&self, fault: Fault, probability: f64) {
        self.with(|a| {
            a.random.retain(|(f, _)| *f != fault);
            if probability > 0.0 {
                a.random.push((fault, probability.min(1.0)));
            }
        });
    }

    /// Disarms every fault.
    pub fn clear(&self) {
        self.with(|a| *a = Armed::default());
    }

    /// Queued faults not yet consumed.
    pub fn queued(&self) -> usize {
        self.with(|a| a.queue.len())
    }

    /// The fault for the current request, if any.
    pub(crate) fn pick(&self) -> Option<Fault> {
        if !self.armed.load(Ordering::Acquire) {
            return None;
        }
        self.with(|a| {
            if let Some(f) = a.queue.pop_front() {
                return Some(f);
            }
            let mut roll = rand::random::<f64>();
            for (fault, p) in &a.random {
                if roll < *p {
                    return Some(fault.clone());
                }
                roll -= p;
            }
            None
        })
    }
}

/// Artificial latency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    /// Added before every answer, milliseconds.
    #[serde(default)]
    pub fixed_ms: u64,
    /// Plus a uniform random 0..=jitter_ms, milliseconds.
    #[serde(default)]
    pub jitter_ms: u64,
    /// Between two stream events, milliseconds.
    #[serde(default)]
    pub per_event_ms: u64,
}

/// Latency settings readable without a lock.
#[derive(Debug, Default)]
pub(crate) struct LatencyCell {
    fixed: AtomicU64,
    jitter: AtomicU64,
    per_event: AtomicU64,
}

impl LatencyCell {
    pub(crate) fn set(&self, l: Latency) {
        self.fixed.store(l.fixed_ms, Ordering::Relaxed);
        self.jitter.store(l.jitter_ms, Ordering::Relaxed);
        self.per_event.store(l.per_event_ms, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> Latency {
        Latency {
            fixed_ms: self.fixed.load(Ordering::Relaxed),
            jitter_ms: self.jitter.load(Ordering::Relaxed),
            per_event_ms: self.per_event.load(Ordering::Relaxed),
        }
    }

    /// Sleeps the answer latency, if any.
    pub(crate) async fn answer_delay(&self) {
        let l = self.get();
        let jitter = if l.jitter_ms > 0 { rand::random_range(0..=l.jitter_ms) } else { 0 };
        let total = l.fixed_ms + jitter;
        if total > 0 {
            tokio::time::sleep(Duration::from_millis(total)).await;
        }
    }

    pub(crate) fn per_event(&self) -> Duration {
        Duration::from_millis(self.per_event.load(Ordering::Relaxed))
    }
}

/// [`Fault`] as read from JSON: the same kinds and fields, every variant a struct.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum FaultWire {
    RateLimit {
        #[serde(default)]
        retry_after_ms: Option<u64>,
        #[serde(default)]
        retry_after_secs: Option<u64>,
    },
    InsufficientQuota {},
    ServerError {},
    Status {
        status: u16,
    },
    Hang {},
    Disconnect {},
    StreamCut {
        after_events: usize,
    },
    StreamStall {
        after_events: usize,
    },
}

impl TryFrom<FaultWire> for Fault {
    type Error = String;

    fn try_from(w: FaultWire) -> Result<Self, Self::Error> {
        Ok(match w {
            FaultWire::RateLimit { retry_after_ms, retry_after_secs } => {
                Fault::RateLimit { retry_after_ms, retry_after_secs }
            }
            FaultWire::InsufficientQuota {} => Fault::InsufficientQuota,
            FaultWire::ServerError {} => Fault::ServerError,
            FaultWire::Status { status } => {
                // What an HTTP status line can carry; anything else would silently become a 500.
                if !(100..=599).contains(&status) {
                    return Err(format!(
                        "`status` must be an HTTP status between 100 and 599, got {status}"
                    ));
                }
                Fault::Status { status }
            }
            FaultWire::Hang {} => Fault::Hang,
            FaultWire::Disconnect {} => Fault::Disconnect,
            FaultWire::StreamCut { after_events } => Fault::StreamCut { after_events },
            FaultWire::StreamStall { after_events } => Fault::StreamStall { after_events },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_then_random() {
        let plan = FaultPlan::default();
        assert_eq!(plan.pick(), None);
        plan.fail_next(Fault::ServerError, 2);
        plan.fail_randomly(Fault::Hang, 1.0);
        assert_eq!(plan.pick(), Some(Fault::ServerError));
        assert_eq!(plan.pick(), Some(Fault::ServerError));
        assert_eq!(plan.pick(), Some(Fault::Hang));
        plan.fail_randomly(Fault::Hang, 0.0);
        assert_eq!(plan.pick(), None);
    }
}
