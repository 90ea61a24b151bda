//! The statistics of an evaluation report: a mean with its 95 % confidence interval (normal
//! approximation), and the paired comparison of two arms on the same round trips — the mean
//! difference with its interval, and the exact two-sided sign test on the pairs that differ,
//! which assumes nothing about the scores' distribution (they are often 0/1).

use serde::{Deserialize, Serialize};

/// z for a two-sided 95 % interval.
const Z95: f64 = 1.959_964;

/// A mean and its 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Observations.
    pub n: usize,
    /// Their mean.
    pub mean: f64,
    /// Lower end of the 95 % interval.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Estimate {
    /// The mean of `xs` with `mean ± 1.96·s/√n` (`None` when empty).
    pub fn of(xs: &[f64]) -> Option<Estimate> {
        let n = xs.len();
        if n == 0 {
            return None;
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        let half = if n > 1 {
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            Z95 * (var / n as f64).sqrt()
        } else {
            0.0
        };
        Some(Estimate { n, mean, low: mean - half, high: mean + half })
    }
}

/// Two arms on the same round trips: `arm − baseline`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Paired {
    /// The mean difference and its interval.
    pub difference: Estimate,
    /// Pairs where the arm did better (scored higher, or lower where lower is better).
    pub better: usize,
    /// Pairs where it did worse.
    pub worse: usize,
    /// Two-sided p-value of the sign test over `better` and `worse` (ties left out).
    pub p_value: f64,
}

impl Paired {
    /// The comparison of `pairs` (`(baseline, arm)` scores of the same round trips) for a
    /// score that is better higher, or lower (`lower_is_better`: latency, cost).
    pub fn of(pairs: &[(f64, f64)], lower_is_better: bool) -> Option<Paired> {
        let diffs: Vec<f64> = pairs.iter().map(|(b, a)| a - b).collect();
        let difference = Estimate::of(&diffs)?;
        let (up, down) = (
            diffs.iter().filter(|d| **d > 0.0).count(),
            diffs.iter().filter(|d| **d < 0.0).count(),
        );
        let (better, worse) = if lower_is_better { (down, up) } else { (up, down) };
        Some(Paired { difference, better, worse, p_value: sign_test(better, worse) })
    }
}

/// Exact two-sided sign test: the chance, with no difference between the arms, of a split at
/// least as uneven as `a` to `b` among `a + b` pairs that differ.
pub fn sign_test(a: usize, b: usize) -> f64 {
    let n = a + b;
    if n == 0 {
        return 1.0;
    }
    let k = a.min(b);
    // P(X <= k) for X ~ Binomial(n, 1/2), summed in log space (0.5^n underflows past n = 1074).
    let mut log_pmf = n as f64 * 0.5f64.ln();
    let mut logs = vec![log_pmf];
    for i in 0..k {
        log_pmf += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
        logs.push(log_pmf);
    }
    let top = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tail = top.exp() * logs.iter().map(|l| (l - top).exp()).sum::<f64>();
    (2.0 * tail).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sign_test_matches_the_binomial_tail() {
        // 8 of 8 pairs one way: 2 · 0.5^8.
        assert!((sign_test(0, 8) - 2.0 / 256.0).abs() < 1e-12);
        // 1 of 9 one way: 2 · (1 + 9) / 512.
        assert!((sign_test(8, 1) - 20.0 / 512.0).abs() < 1e-12);
        assert_eq!(sign_test(5, 5), 1.0);
        assert_eq!(sign_test(0, 0), 1.0);
        // Large n stays finite: 1,000 against 1,100 is unlikely under no difference.
        let p = sign_test(1000, 1100);
        assert!(p > 0.0 && p < 0.05, "{p}");
    }

    #[test]
    fn a_mean_has_a_normal_interval_and_pairs_their_difference() {
        let e = Estimate::of(&[1.0, 0.0, 1.0, 0.0]).unwrap();
        assert_eq!((e.n, e.mean), (4, 0.5));
        assert!((e.high - e.mean - Z95 * (1.0f64 / 3.0 / 4.0).sqrt()).abs() < 1e-9);
        assert!(Estimate::of(&[]).is_none());
        let p = Paired::of(&[(1.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 0.0)], false).unwrap();
        assert_eq!((p.better, p.worse, p.difference.mean), (0, 2, -0.5));
        assert!((p.p_value - 0.5).abs() < 1e-12);
        // Lower latency is better: a drop counts for the arm.
        let p = Paired::of(&[(20.0, 5.0), (30.0, 10.0)], true).unwrap();
        assert_eq!((p.better, p.worse, p.difference.mean), (2, 0, -17.5));
    }
}
