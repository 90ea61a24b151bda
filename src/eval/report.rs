//! The report of an evaluation (versioned JSON, kept in `eval_runs`): per arm the mean of each
//! scorer with its 95 % interval and, against the baseline arm on the same round trips, the mean
//! difference and the sign test; then the worst regressions of the primary scorer (`regex` when
//! given, else `exact`), each with both records' ids and the console's page of its turn.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::score::LOWER_IS_BETTER;
use super::stats::{Estimate, Paired};
use super::{EvalOptions, ORIGINAL};
use crate::config::ModelPrice;
use crate::reprocess::Report;
use crate::store::EvalRow;

/// Version of the report's JSON.
pub const VERSION: u32 = 1;
/// Most regressions listed.
const REGRESSIONS: usize = 10;

/// A whole evaluation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    /// [`VERSION`].
    pub version: u32,
    /// The evaluation's id.
    pub run: String,
    /// The arm the others are compared with.
    pub baseline: String,
    /// The scorer regressions are listed by.
    pub primary: String,
    /// Every arm, the baseline first.
    pub arms: Vec<ArmReport>,
    /// The worst regressions against the baseline, worst first.
    pub regressions: Vec<Regression>,
    /// What the LLM judge did and spent, when there was one.
    #[serde(default)]
    pub judge: Option<super::JudgeSpend>,
}

/// One arm's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArmReport {
    /// Its name.
    pub name: String,
    /// Its model, when it overrides the turns'.
    pub model: Option<String>,
    /// Its ConversationContext, when it overrides the turns'.
    pub conversation_context: Option<String>,
    /// Round trips it has records of.
    pub round_trips: usize,
    /// Turns of the selection it has not replayed yet (failed or left: run again).
    pub turns_not_done: usize,
    /// Turns it cannot replay (a steered follow-up, a turn whose saved inputs are gone).
    #[serde(default)]
    pub turns_not_replayable: usize,
    /// Per scorer: the mean and its interval.
    pub scores: BTreeMap<String, Estimate>,
    /// Per scorer: this arm minus the baseline on the round trips both have.
    pub versus_baseline: BTreeMap<String, Paired>,
}

/// A round trip the arm did worse on than the baseline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Regression {
    /// The arm.
    pub arm: String,
    /// Session.
    pub session_id: Uuid,
    /// Turn.
    pub turn_id: String,
    /// Round trip.
    pub step: i32,
    /// The baseline's score.
    pub baseline_score: f64,
    /// The arm's.
    pub arm_score: f64,
    /// The baseline's record.
    pub baseline_record: Uuid,
    /// The arm's record (nil when the arm's replay never reached this round trip).
    pub arm_record: Uuid,
    /// The console's page of the turn, which lists both records.
    pub page: String,
}

type Key = (Uuid, String, i32);

/// One arm's scored round trips: scores and the record each came from.
type Scored = BTreeMap<Key, (BTreeMap<&'static str, f64>, Uuid)>;

/// The report of `rows` (per arm) and the arms' reprocess `runs`.
pub fn build(
    opts: &EvalOptions,
    rows: &BTreeMap<String, Vec<EvalRow>>,
    runs: &BTreeMap<String, Report>,
    prices: &[ModelPrice],
    judged: &super::judge::Judged,
) -> EvalReport {
    let key = |r: &EvalRow| (r.session_id, r.turn_id.clone(), r.step);
    let mut scored: BTreeMap<String, Scored> = BTreeMap::new();
    for (arm, list) in rows {
        for r in list {
            let own = (opts.scorers.score(r, false, prices), r.new_id);
            scored.entry(arm.clone()).or_default().insert(key(r), own);
            let original = (opts.scorers.score(r, true, prices), r.original_id);
            scored.entry(ORIGINAL.to_owned()).or_default().entry(key(r)).or_insert(original);
        }
    }
    for ((arm, key), score) in judged {
        if let Some((scores, _)) = scored.get_mut(arm).and_then(|s| s.get_mut(key)) {
            scores.insert("judge", *score);
        }
    }
    let primary = if opts.scorers.expect.is_some() { "regex" } else { "exact" };
    let empty = Scored::new();
    let base = scored.get(&opts.baseline).unwrap_or(&empty);
    let mut names: Vec<String> = vec![opts.baseline.clone()];
    if opts.baseline != ORIGINAL {
        names.insert(0, ORIGINAL.to_owned());
        names.dedup();
    }
    names.extend(opts.arms.iter().map(|a| a.name.clone()).filter(|n| *n != opts.baseline));
    let mut arms = Vec::new();
    let mut regressions = Vec::new();
    for name in names {
        let mine = scored.get(&name).unwrap_or(&empty);
        let arm = opts.arms.iter().find(|a| a.name == name);
        let run = runs.get(&name);
        arms.push(ArmReport {
            name: name.clone(),
            model: arm.and_then(|a| a.model.clone()),
            conversation_context: arm.and_then(|a| a.conversation_context.clone()),
            round_trips: mine.len(),
            turns_not_done: run.map_or(0, |r| r.failed + r.left),
            turns_not_replayable: run.map_or(0, |r| r.unavailable),
            scores: means(mine),
            versus_baseline: if name == opts.baseline {
                BTreeMap::new()
            } else {
                paired(base, mine)
            },
        });
        if name != opts.baseline && name != ORIGINAL {
            regressions.extend(worse(&name, primary, base, mine));
        }
    }
    // Worst first within each arm, at most REGRESSIONS per arm (0/1 scores tie: one arm's
    // must not crowd out another's).
    let gap = |r: &Regression| (r.baseline_score - r.arm_score).abs();
    regressions.sort_by(|a, b| a.arm.cmp(&b.arm).then(gap(b).total_cmp(&gap(a))));
    let mut kept: BTreeMap<String, usize> = BTreeMap::new();
    regressions.retain(|r| {
        let n = kept.entry(r.arm.clone()).or_default();
        *n += 1;
        *n <= REGRESSIONS
    });
    EvalReport {
        version: VERSION,
        run: opts.run.clone(),
        baseline: opts.baseline.clone(),
        primary: primary.to_owned(),
        arms,
        regressions,
        judge: None,
    }
}

fn means(scored: &Scored) -> BTreeMap<String, Estimate> {
    let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (scores, _) in scored.values() {
        for (name, v) in scores {
            values.entry(name).or_default().push(*v);
        }
    }
    values.into_iter().filter_map(|(n, xs)| Some((n.to_owned(), Estimate::of(&xs)?))).collect()
}

/// The arm's score of `name` on a round trip the baseline has: a round trip the arm never
/// reached (its replay took another path and ended sooner) scores 0 where higher is better, and
/// is left out where lower is (it cost and took nothing, which is no merit).
fn arm_score(mine: &Scored, key: &Key, name: &str) -> Option<f64> {
    match mine.get(key) {
        Some((scores, _)) => scores.get(name).copied(),
        None => (!LOWER_IS_BETTER.contains(&name)).then_some(0.0),
    }
}

fn paired(base: &Scored, mine: &Scored) -> BTreeMap<String, Paired> {
    let mut pairs: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for (key, (theirs, _)) in base {
        for (name, b) in theirs {
            if let Some(a) = arm_score(mine, key, name) {
                pairs.entry(name).or_default().push((*b, a));
            }
        }
    }
    pairs
        .into_iter()
        .filter_map(|(n, p)| Some((n.to_owned(), Paired::of(&p, LOWER_IS_BETTER.contains(&n))?)))
        .collect()
}

fn worse(arm: &str, scorer: &str, base: &Scored, mine: &Scored) -> Vec<Regression> {
    let lower_better = LOWER_IS_BETTER.contains(&scorer);
    base.iter()
        .filter_map(|(key, (theirs, base_record))| {
            let (b, a) = (*theirs.get(scorer)?, arm_score(mine, key, scorer)?);
            // A round trip the arm never reached has no record of its own: the turn's page.
            let record = mine.get(key).map_or(Uuid::nil(), |(_, r)| *r);
            let regressed = if lower_better { a > b } else { a < b };
            regressed.then(|| Regression {
                arm: arm.to_owned(),
                session_id: key.0,
                turn_id: key.1.clone(),
                step: key.2,
                baseline_score: b,
                arm_score: a,
                baseline_record: *base_record,
                arm_record: record,
                page: format!("/sessions/{}/turns/{}", key.0, key.1),
            })
        })
        .collect()
}

impl std::fmt::Display for EvalReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "eval {} (baseline {}, regressions by {})",
            self.run, self.baseline, self.primary
        )?;
        for arm in &self.arms {
            let what = [
                arm.model.as_deref().map(|m| format!("model {m}")),
                arm.conversation_context.as_deref().map(|c| format!("context {c}")),
            ];
            let what: Vec<String> = what.into_iter().flatten().collect();
            let what =
                if what.is_empty() { String::new() } else { format!(" ({})", what.join(", ")) };
            let (name, trips, left) = (&arm.name, arm.round_trips, arm.turns_not_done);
            let never = arm.turns_not_replayable;
            writeln!(
                f,
                "\narm {name}{what}: {trips} round trips, {left} turns not done, {never} not replayable"
            )?;
            for (name, e) in &arm.scores {
                write!(f, "  {name:<18} {:>10.4}  [{:.4}, {:.4}]", e.mean, e.low, e.high)?;
                if let Some(p) = arm.versus_baseline.get(name) {
                    let d = &p.difference;
                    write!(
                        f,
                        "   vs baseline {:+.4} [{:+.4}, {:+.4}], {} better, {} worse, p = {:.3}",
                        d.mean, d.low, d.high, p.better, p.worse, p.p_value
                    )?;
                }
                writeln!(f)?;
            }
        }
        if let Some(j) = &self.judge {
            let (n, left, cost) = (j.judged, j.unjudged, j.cost_usd);
            writeln!(f, "\njudge: {n} answers judged, {left} unjudged, ${cost:.6} spent")?;
        }
        if !self.regressions.is_empty() {
            writeln!(f, "\nworst regressions ({}):", self.primary)?;
        }
        for r in &self.regressions {
            writeln!(
                f,
                "  {} {} {} step {}: {} -> {} (records {} -> {}, {})",
                r.arm,
                r.session_id,
                r.turn_id,
                r.step,
                r.baseline_score,
                r.arm_score,
                r.baseline_record,
                r.arm_record,
                r.page
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{Arm, Scorers};
    use crate::reprocess::Selection;
    use serde_json::json;

    fn row(turn: &str, step: i32, original: &str, new: &str) -> EvalRow {
        let reply = |text: &str| json!({"Result": {"PrimaryOutputText": text}});
        EvalRow {
            original_id: Uuid::from_u128(1),
            session_id: Uuid::nil(),
            turn_id: turn.into(),
            step,
            original_kind: "final".into(),
            original_reply: reply(original),
            original_usage: None,
            original_chunks: None,
            original_model: None,
            instruction: None,
            new_id: Uuid::from_u128(2),
            new_kind: "final".into(),
            new_reply: reply(new),
            new_usage: None,
            new_chunks: None,
            new_model: None,
            new_tools: None,
            new_timings: None,
        }
    }

    #[test]
    fn a_round_trip_an_arm_never_reached_counts_against_it() {
        let opts = EvalOptions {
            selection: Selection::default(),
            run: "r".into(),
            arms: vec!["a".parse::<Arm>().unwrap(), "b".parse::<Arm>().unwrap()],
            baseline: "a".into(),
            scorers: Scorers::default(),
            judge: None,
            rate: None,
            concurrency: 1,
        };
        // Arm a replays both round trips of t1 as the original; arm b stops after the first.
        let rows = BTreeMap::from([
            ("a".to_owned(), vec![row("t1", 0, "x", "x"), row("t1", 1, "y", "y")]),
            ("b".to_owned(), vec![row("t1", 0, "x", "x")]),
        ]);
        let report = build(&opts, &rows, &BTreeMap::new(), &[], &BTreeMap::new());
        let b = report.arms.iter().find(|a| a.name == "b").unwrap();
        let exact = &b.versus_baseline["exact"];
        assert_eq!((exact.worse, exact.better, exact.difference.n), (1, 0, 2));
        assert_eq!(report.regressions.len(), 1);
        assert_eq!(
            (report.regressions[0].step, report.regressions[0].arm_record),
            (1, Uuid::nil())
        );
    }
}
