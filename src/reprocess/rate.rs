//! The `--rate` limit: turns start at most `rate` per second, evenly spaced, however many run at
//! once. Turns skipped without calling the model take no slot.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// Hands out start times at a fixed interval.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    interval: Option<Duration>,
    next: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// At most `per_second` starts per second; `None` (or a non-positive rate) is unlimited.
    pub(crate) fn new(per_second: Option<f64>) -> Self {
        let interval = per_second
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(|r| Duration::from_secs_f64(1.0 / r));
        RateLimiter { interval, next: Mutex::new(None) }
    }

    /// Waits for the next start slot.
    pub(crate) async fn wait(&self) {
        let Some(interval) = self.interval else { return };
        let at = {
            let mut next = self.next.lock().await;
            let now = Instant::now();
            let at = next.map_or(now, |n| n.max(now));
            *next = Some(at + interval);
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spaces_starts_evenly() {
        let limiter = RateLimiter::new(Some(50.0));
        let start = Instant::now();
        for _ in 0..5 {
            limiter.wait().await;
        }
        // Five starts at 20 ms intervals: the fifth starts 80 ms after the first.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(80) && elapsed < Duration::from_millis(500),
            "{elapsed:?}"
        );
        let unlimited = RateLimiter::new(None);
        let start = Instant::now();
        for _ in 0..100 {
            unlimited.wait().await;
        }
        assert!(start.elapsed() < Duration::from_millis(50));
    }
}
