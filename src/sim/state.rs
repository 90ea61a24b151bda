//! The simulator's shared state: stored responses (bounded, oldest evicted first), the bounded
//! request log, id generation and counters. Locks are held only to insert or look up an `Arc`,
//! never while building an answer, so the hot path stays short.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

use super::cache::PromptCache;
use super::faults::{FaultPlan, LatencyCell};
use super::SimConfig;

/// A stored response and what the next turn of its chain needs to know.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The response object, serialized once.
    pub json: Bytes,
    /// `call_id`s of its function calls, which the next request must answer.
    pub pending_calls: Vec<String>,
    /// Responses in the chain up to and including this one.
    pub depth: u32,
    /// Tokens the chain carries into the next turn (billed again as input).
    pub context_tokens: u64,
    /// System/developer messages sent in the chain so far.
    pub system_messages: u64,
    /// Tokens of the prompt that produced it: what a cache machine holds of it.
    pub prompt_tokens: u64,
    /// The chain's opening (tools and first message), hashed: what the provider routes by.
    pub opening: u64,
    /// Tokens of that opening.
    pub opening_tokens: u64,
}

#[derive(Debug, Default)]
struct Store {
    map: HashMap<Arc<str>, Arc<Stored>>,
    order: VecDeque<Arc<str>>,
}

/// One received `POST /v1/responses` body, exactly as sent.
#[derive(Debug, Clone)]
pub struct LoggedRequest {
    /// Arrival order, from 0 (not reset by clearing the log).
    pub seq: u64,
    /// The raw body.
    pub body: Bytes,
}

impl LoggedRequest {
    /// The body as JSON, or `None` when it is not JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Counters, as returned by `GET /_sim/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// `POST /v1/responses` requests received.
    pub requests: u64,
    /// Responses produced (any status).
    pub responses: u64,
    /// Error answers sent (validation, auth, injected statuses).
    pub errors: u64,
    /// Faults injected.
    pub faults: u64,
    /// Responses currently stored.
    pub stored: u64,
    /// Paced streams (`per_event_ms` > 0) their client closed before the last event.
    pub streams_abandoned: u64,
    /// Input tokens of every response produced.
    pub input_tokens: u64,
    /// Of those, tokens the prompt cache served (`input_tokens_details.cached_tokens`).
    pub cached_tokens: u64,
}

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct SimState {
    pub api_key: Option<String>,
    pub delta_chars: usize,
    pub hang_limit: std::time::Duration,
    pub faults: FaultPlan,
    pub latency: LatencyCell,
    pub shutdown: watch::Receiver<bool>,
    store: Mutex<Store>,
    store_capacity: usize,
    log: Mutex<VecDeque<LoggedRequest>>,
    log_capacity: usize,
    nonce: u32,
    next_id: AtomicU64,
    pub requests: AtomicU64,
    pub responses: AtomicU64,
    pub errors: AtomicU64,
    pub faults_injected: AtomicU64,
    pub streams_abandoned: AtomicU64,
    pub cache: PromptCache,
    input_tokens: AtomicU64,
    cached_tokens: AtomicU64,
}

impl SimState {
    pub(crate) fn new(config: &SimConfig, shutdown: watch::Receiver<bool>) -> Self {
        let latency = LatencyCell::default();
        latency.set(config.latency);
        SimState {
            api_key: config.api_key.clone(),
            delta_chars: config.delta_chars.max(1),
            hang_limit: config.hang_limit,
            faults: FaultPlan::default(),
            latency,
            shutdown,
            store: Mutex::default(),
            store_capacity: config.store_capacity.max(1),
            log: Mutex::default(),
            log_capacity: config.log_capacity,
            // Ids differ between runs so a stale id from an earlier run is never found.
            nonce: rand::random(),
            next_id: AtomicU64::new(1),
            requests: AtomicU64::new(0),
            responses: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            faults_injected: AtomicU64::new(0),
            streams_abandoned: AtomicU64::new(0),
            cache: PromptCache::default(),
            input_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
        }
    }

    /// A fresh id such as `resp_1a2b3c4d000000002a`.
    pub(crate) fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}_{:08x}{n:010x}", self.nonce)
    }

    /// Adds a response's input tokens, and those the cache served, to the totals.
    pub(crate) fn count_tokens(&self, input: u64, cached: u64) {
        self.input_tokens.fetch_add(input, Ordering::Relaxed);
        self.cached_tokens.fetch_add(cached, Ordering::Relaxed);
    }

    /// Records a request body; returns its sequence number.
    pub(crate) fn log_request(&self, body: Bytes) -> u64 {
        let seq = self.requests.fetch_add(1, Ordering::Relaxed);
        if self.log_capacity > 0 {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            if log.len() == self.log_capacity {
                log.pop_front();
            }
            log.push_back(LoggedRequest { seq, body });
        }
        seq
    }

    pub(crate) fn logged(&self) -> Vec<LoggedRequest> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    pub(crate) fn clear_log(&self) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).map.get(id).cloned()
    }

    pub(crate) fn put(&self, id: String, stored: Stored) {
        let id: Arc<str> = id.into();
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if store.order.len() >= self.store_capacity {
            if let Some(old) = store.order.pop_front() {
                store.map.remove(&old);
            }
        }
        store.order.push_back(id.clone());
        store.map.insert(id, Arc::new(stored));
    }

    /// The "forget everything" switch: every stored response is gone, as after expiry.
    pub(crate) fn forget_all(&self) {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        *store = Store::default();
    }

    pub(crate) fn stats(&self) -> SimStats {
        let stored = self.store.lock().unwrap_or_else(|e| e.into_inner()).map.len() as u64;
        SimStats {
            requests: self.requests.load(Ordering::Relaxed),
            responses: self.responses.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            faults: self.faults_injected.load(Ordering::Relaxed),
            stored,
            streams_abandoned: self.streams_abandoned.load(Ordering::Relaxed),
            input_tokens: self.input_tokens.load(Ordering::Relaxed),
            cached_tokens: self.cached_tokens.load(Ordering::Relaxed),
        }
    }

    /// Resolves when the simulator shuts down.
    pub(crate) async fn closed(&self) {
        let mut rx = self.shutdown.clone();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}
