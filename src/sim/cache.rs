//! The provider's prompt cache, as OpenAI's prompt-caching guide describes it, so that
//! `cached_tokens` answers the question a client asks of it: did this request reach a machine
//! that holds its prefix? A request goes to the machine its *routing bucket* (a hash of the
//! prompt's first ~256 tokens and its `prompt_cache_key`) maps to; a bucket busier than about
//! 15 requests a minute overflows to other machines; a machine serves a prefix it processed in
//! the last minutes, in 128-token steps from 1,024 tokens on. The figures are the guide's;
//! the overflow's spread (any machine) is this model's own assumption.
//!
//! A prefix is named by what produced it: a chain's stored response (the whole prompt that
//! call processed), or the first message of a chain (a boot prompt that sessions share).

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Cache machines behind the simulated endpoint.
const MACHINES: u64 = 16;
/// Requests a bucket may send in [`WINDOW`] before the excess overflows.
const BUCKET_RATE: usize = 15;
const WINDOW: Duration = Duration::from_secs(60);
/// A prefix unused this long is gone (the guide: 5 to 10 minutes of inactivity).
const IDLE: Duration = Duration::from_secs(300);
/// Prefixes one machine holds; the least recently used goes first beyond it.
const PER_MACHINE: usize = 20_000;
/// No caching below this many prompt tokens; hits count in steps of [`STEP`].
const MIN_TOKENS: u64 = 1024;
const STEP: u64 = 128;

/// A prefix a machine may hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Prefix {
    /// The whole prompt of the call that produced this stored response.
    Response(String),
    /// A chain's first message (its hash).
    Opening(u64),
}

/// What one request offers the cache.
#[derive(Debug)]
pub(crate) struct Lookup<'a> {
    /// Hash of the prompt's first ~256 tokens (the chain's opening).
    pub opening: u64,
    /// Tokens of that opening message.
    pub opening_tokens: u64,
    /// The response this request chains onto, and the tokens of the prompt that produced it.
    pub previous: Option<(&'a str, u64)>,
    /// The request's `prompt_cache_key`.
    pub key: Option<&'a str>,
}

#[derive(Debug, Default)]
struct Inner {
    buckets: HashMap<u64, VecDeque<Instant>>,
    machines: HashMap<u64, HashMap<Prefix, Instant>>,
    routed: u64,
}

/// The cache machines and the routing in front of them.
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    inner: Mutex<Inner>,
}

impl PromptCache {
    /// Routes one request: returns its cached tokens and the machine that now holds its
    /// prompt, which [`PromptCache::hold`] is told once the response has an id.
    pub(crate) fn lookup(&self, req: &Lookup<'_>) -> (u64, u64) {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = hash(&(req.opening, req.key));
        let recent = inner.buckets.entry(bucket).or_default();
        while recent.front().is_some_and(|t| now.duration_since(*t) > WINDOW) {
            recent.pop_front();
        }
        let busy = recent.len() >= BUCKET_RATE;
        recent.push_back(now);
        inner.routed += 1;
        let machine = if busy { hash(&(bucket, inner.routed)) } else { bucket } % MACHINES;
        let held = inner.machines.entry(machine).or_default();
        let mut cached = 0;
        let mut offered = vec![(Prefix::Opening(req.opening), req.opening_tokens)];
        if let Some((id, tokens)) = req.previous {
            offered.push((Prefix::Response(id.to_owned()), tokens));
        }
        for (prefix, tokens) in offered {
            if let Some(used) = held.get_mut(&prefix) {
                if now.duration_since(*used) <= IDLE {
                    *used = now;
                    cached = cached.max(tokens);
                }
            }
        }
        held.insert(Prefix::Opening(req.opening), now);
        (usable(cached), machine)
    }

    /// `machine` now holds the prompt that produced response `id`.
    pub(crate) fn hold(&self, machine: u64, id: &str) {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let held = inner.machines.entry(machine).or_default();
        if held.len() >= PER_MACHINE {
            held.retain(|_, used| now.duration_since(*used) <= IDLE);
            if held.len() >= PER_MACHINE {
                if let Some(oldest) = held.iter().min_by_key(|(_, t)| **t).map(|(p, _)| p.clone()) {
                    held.remove(&oldest);
                }
            }
        }
        held.insert(Prefix::Response(id.to_owned()), now);
    }
}

/// Cached tokens as the provider counts them: none under 1,024, else whole 128-token steps.
fn usable(tokens: u64) -> u64 {
    if tokens < MIN_TOKENS {
        0
    } else {
        tokens / STEP * STEP
    }
}

/// A stable hash (one process; nothing outside it sees the value).
pub(crate) fn hash(value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chained<'a>(opening: u64, previous: &'a str, key: Option<&'a str>) -> Lookup<'a> {
        Lookup { opening, opening_tokens: 500, previous: Some((previous, 3000)), key }
    }

    #[test]
    fn a_quiet_chain_finds_its_prefix() {
        let cache = PromptCache::default();
        let (cached, machine) =
            cache.lookup(&Lookup { opening: 1, opening_tokens: 500, previous: None, key: None });
        assert_eq!(cached, 0, "nothing held yet");
        cache.hold(machine, "resp_a");
        let (cached, _) = cache.lookup(&chained(1, "resp_a", None));
        assert_eq!(cached, 2944, "3,000 tokens in whole 128-token steps");
    }

    #[test]
    fn short_prefixes_are_not_cached() {
        assert_eq!(usable(1023), 0);
        assert_eq!(usable(1024), 1024);
        assert_eq!(usable(1300), 1280);
    }

    #[test]
    fn a_busy_shared_bucket_overflows_and_a_key_per_chain_does_not() {
        // 40 chains sharing one opening, one call each to start, then one chained call each.
        let share = |keyed: bool| {
            let cache = PromptCache::default();
            let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
            let key = |i: usize| keyed.then(|| keys[i].as_str());
            for (i, _) in keys.iter().enumerate() {
                let first = Lookup { opening: 7, opening_tokens: 500, previous: None, key: key(i) };
                let (_, machine) = cache.lookup(&first);
                cache.hold(machine, &format!("r{i}"));
            }
            let ids: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
            let hits =
                (0..40).filter(|&i| cache.lookup(&chained(7, &ids[i], key(i))).0 > 0).count();
            hits as f64 / 40.0
        };
        assert_eq!(share(true), 1.0, "each chain's bucket is quiet");
        assert!(share(false) < 0.5, "one bucket of 80 calls a minute spreads: {}", share(false));
    }
}
