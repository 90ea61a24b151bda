//! A bound on `turn.resume` per session (`pipeline.resumes_per_minute`, client protocol §9a).
//! Each resume makes the server publish a turn's kept events again, up to
//! `pipeline.stream_events_per_step` per step: a client that sent them in a loop would spend the
//! validate stage, which every session of its ingress queue shares, on its own. A session's
//! requests all reach one ingress queue with one active consumer, so the count lives in that
//! worker's memory; a handover to another worker starts it again, which a hostile client cannot
//! cause. A client that publishes a session's requests under routing keys other than its
//! SessionId reaches other ingress partitions, each counting on its own: the bound is then the
//! partition count times the limit, still a bound (client protocol §9a says so). It counts per
//! tenant and session, so another tenant's resumes of a session (refused with
//! `session.unavailable`) spend that tenant's count, not the session's own clients'.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::contracts::SessionId;

/// The window the limit counts in.
const WINDOW: Duration = Duration::from_secs(60);

/// Sessions counted at most; past that, after the windows that ended are dropped, a resume of a
/// session not counted yet is refused rather than let through uncounted.
const MAX_SESSIONS: usize = 100_000;

/// Sessions one tenant may have counted at once, so that one tenant resuming sessions by the
/// thousand (existing or not: the count comes before any read) fills its own share, not the
/// table every tenant's resumes are counted in. Without tenants, the table is the share.
const MAX_SESSIONS_PER_TENANT: usize = MAX_SESSIONS / 10;

/// How often the windows that ended are dropped at most.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Who resumed which session: the caller's tenant (none in a single-tenant deployment).
type Counted = (Option<String>, SessionId);

/// Resumes of each session in its current one-minute window.
#[derive(Debug)]
pub(super) struct ResumeGate {
    /// Resumes a session may make per window; 0: no limit.
    limit: u32,
    windows: Mutex<Windows>,
}

/// The windows, and how many of them each tenant holds.
#[derive(Debug, Default)]
struct Windows {
    open: HashMap<Counted, (Instant, u32)>,
    per_tenant: HashMap<Option<String>, usize>,
    /// When the windows that ended were last dropped: at most once a second, so a tenant that
    /// keeps resuming new sessions at its share's end costs one pass a second, not one a resume.
    swept: Option<Instant>,
}

impl Windows {
    /// Room for a window of `key` at `now`. A tenant's share bounds its windows; a single-tenant
    /// deployment's callers (no tenant) share the whole table.
    fn room_for(&mut self, key: &Counted, now: Instant) -> bool {
        if self.open.contains_key(key) {
            return true;
        }
        let full = |w: &Windows| {
            let share = w.per_tenant.get(&key.0).copied().unwrap_or(0);
            w.open.len() >= MAX_SESSIONS || (key.0.is_some() && share >= MAX_SESSIONS_PER_TENANT)
        };
        if full(&*self) && self.swept.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY) {
            self.swept = Some(now);
            self.open.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
            self.per_tenant.clear();
            for (tenant, _) in self.open.keys() {
                *self.per_tenant.entry(tenant.clone()).or_default() += 1;
            }
        }
        !full(&*self)
    }
}

impl ResumeGate {
    /// A gate letting `limit` resumes per session per minute through (0: any number).
    pub(super) fn new(limit: u32) -> Self {
        ResumeGate { limit, windows: Mutex::new(Windows::default()) }
    }

    /// Whether one more resume of `session` by a client of `tenant` may be answered at `now`;
    /// counted when it may.
    pub(super) fn admit(&self, tenant: Option<&str>, session: SessionId, now: Instant) -> bool {
        if self.limit == 0 {
            return true;
        }
        let mut windows = self.windows.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (tenant.map(str::to_owned), session);
        if !windows.room_for(&key, now) {
            return false;
        }
        if !windows.open.contains_key(&key) {
            *windows.per_tenant.entry(key.0.clone()).or_default() += 1;
        }
        let (start, count) = windows.open.entry(key).or_insert((now, 0));
        if now.duration_since(*start) >= WINDOW {
            (*start, *count) = (now, 0);
        }
        if *count >= self.limit {
            return false;
        }
        *count += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_gets_its_limit_per_minute_and_others_are_not_affected() {
        let gate = ResumeGate::new(2);
        let (a, b) = (SessionId::new(uuid::Uuid::new_v4()), SessionId::new(uuid::Uuid::new_v4()));
        let t0 = Instant::now();
        assert!(gate.admit(None, a, t0) && gate.admit(None, a, t0));
        assert!(!gate.admit(None, a, t0 + Duration::from_secs(59)), "a third within the minute");
        assert!(gate.admit(None, b, t0), "another session has its own count");
        assert!(gate.admit(Some("other"), a, t0), "another tenant's resumes are its own");
        assert!(gate.admit(None, a, t0 + WINDOW), "a new window");
        assert!(ResumeGate::new(0).admit(None, a, t0), "0 is no limit");
    }

    #[test]
    fn a_tenant_resuming_sessions_by_the_thousand_fills_only_its_share() {
        let gate = ResumeGate::new(1);
        let t0 = Instant::now();
        let new = || SessionId::new(uuid::Uuid::new_v4());
        for _ in 0..MAX_SESSIONS_PER_TENANT {
            assert!(gate.admit(Some("flood"), new(), t0));
        }
        assert!(!gate.admit(Some("flood"), new(), t0), "its share is full");
        assert!(gate.admit(Some("other"), new(), t0), "another tenant's resume is counted");
        assert!(!gate.admit(Some("flood"), new(), t0), "no sweep again within the second");
        assert!(gate.admit(Some("flood"), new(), t0 + WINDOW), "the windows ended");
        let single = ResumeGate::new(1);
        for _ in 0..=MAX_SESSIONS_PER_TENANT {
            assert!(single.admit(None, new(), t0), "without tenants the table is the share");
        }
    }
}
