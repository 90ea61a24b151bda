//! The report of an evaluation (versioned JSON, kept in `eval_runs`): per arm the mean of each
//! scorer with its 95 % interval and, against the baseline arm on the same round trips, the mean
//! difference and the sign test; then the worst regressions of the primary scorer (`regex` when
//! given, else `exact`), each with both records' ids and the console's page of its turn. A turn
//! an arm has no record of and did not fail was never run and is left out of its comparison
//! (counted in `turns_not_run`); a round trip it never reached within a turn it ran, or that its
//! model gave no answer to, counts against it.

use std::collections::{BTreeMap, BTreeSet};

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
    /// The run was interrupted (Ctrl-C, shutdown): arms after that point ran nothing more and
    /// the judge was not started or stopped early, so the report is partial. Running the same
    /// `--run` again finishes it.
    #[serde(default)]
    pub interrupted: bool,
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
    /// Turns of the evaluation (those any arm has a record of) that this arm has no record of:
    /// never run (interrupted before or during its arm) or failed without an answer (the
    /// provider rejected its model, say). They are left out of `versus_baseline` and the
    /// regressions, since they say nothing of how the arm answers.
    #[serde(default)]
    pub turns_not_run: usize,
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

/// Turns (session, turn id) an arm has a record of, at any round trip.
type Turns<'a> = BTreeSet<(Uuid, &'a str)>;

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
            // A round trip the arm never reached has only its original (`new_id` nil).
            if !r.new_id.is_nil() {
                let own = (opts.scorers.score(r, false, prices), r.new_id);
                scored.entry(arm.clone()).or_default().insert(key(r), own);
            }
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
    // The originals of every arm's records: each turn some arm ran.
    let every_turn = scored.get(ORIGINAL).map(turns).unwrap_or_default();
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
        // Turns the arm answered, and those its model gave no answer to (which count against
        // it); the others it never ran.
        let mut ran = turns(mine);
        ran.extend(run.iter().flat_map(|r| r.unanswered.iter().map(|(s, t)| (*s, t.as_str()))));
        arms.push(ArmReport {
            name: name.clone(),
            model: arm.and_then(|a| a.model.clone()),
            conversation_context: arm.and_then(|a| a.conversation_context.clone()),
            round_trips: mine.len(),
            turns_not_done: run.map_or(0, |r| r.failed + r.left),
            turns_not_replayable: run.map_or(0, |r| r.unavailable),
            turns_not_run: every_turn.difference(&ran).count(),
            scores: means(mine),
            versus_baseline: if name == opts.baseline {
                BTreeMap::new()
            } else {
                paired(base, mine, &ran)
            },
        });
        if name != opts.baseline && name != ORIGINAL {
            regressions.extend(worse(&name, primary, base, (mine, &ran)));
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
        interrupted: false,
    }
}

/// The turns `scored` has a record of.
fn turns(scored: &Scored) -> Turns<'_> {
    scored.keys().map(|(session, turn, _)| (*session, turn.as_str())).collect()
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

/// The arm's score of `name` on a round trip the baseline has, or none when it is left out.
/// A turn the arm never `ran` is left out: it was never started (interrupted), or its provider
/// was down, slow or refused the account, which says nothing of how the arm answers. A round
/// trip missing from a turn it ran was never reached (its replay took another path and ended
/// sooner) or got no answer (the provider refused the arm's model or request): it scores
/// 0 where higher is better, and is left out
/// where lower is (it cost and took nothing, which is no merit).
fn arm_score(mine: &Scored, ran: &Turns<'_>, key: &Key, name: &str) -> Option<f64> {
    match mine.get(key) {
        Some((scores, _)) => scores.get(name).copied(),
        None if !ran.contains(&(key.0, key.1.as_str())) => None,
        None => (!LOWER_IS_BETTER.contains(&name)).then_some(0.0),
    }
}

/// Per scorer, the arm against the baseline on the baseline's round trips (see [`arm_score`]).
fn paired(base: &Scored, mine: &Scored, ran: &Turns<'_>) -> BTreeMap<String, Paired> {
    let mut pairs: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for (key, (theirs, _)) in base {
        for (name, b) in theirs {
            if let Some(a) = arm_score(mine, ran, key, name) {
                pairs.entry(name).or_default().push((*b, a));
            }
        }
    }
    pairs
        .into_iter()
        .filter_map(|(n, p)| Some((n.to_owned(), Paired::of(&p, LOWER_IS_BETTER.contains(&n))?)))
        .collect()
}

/// The baseline's round trips the arm did worse on by `scorer` (see [`arm_score`]).
fn worse(
    arm: &str,
    scorer: &str,
    base: &Scored,
    (mine, ran): (&Scored, &Turns<'_>),
) -> Vec<Regression> {
    let lower_better = LOWER_IS_BETTER.contains(&scorer);
    base.iter()
        .filter_map(|(key, (theirs, base_record))| {
            let (b, a) = (*theirs.get(scorer)?, arm_score(mine, ran, key, scorer)?);
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
        if self.interrupted {
            writeln!(f, "interrupted: partial report; run the same --run again to finish")?;
        }
        for arm in &self.arms {
            let what = [
                arm.model.as_deref().map(|m| format!("model {m}")),
                arm.conversation_context.as_deref().map(|c| format!("context {c}")),
            ];
            let what: Vec<String> = what.into_iter().flatten().collect();
            let what =
                if what.is_empty() { String::new() } else { format!(" ({})", what.join(", ")) };
            let (name, trips, left) = (&arm.name, arm.round_trips, arm.turns_not_done);
            let (never, not_run) = (arm.turns_not_replayable, arm.turns_not_run);
            writeln!(
                f,
                "\narm {name}{what}: {trips} round trips, {left} turns not done, {never} not replayable, {not_run} not run (left out against the baseline)"
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

    /// Arms `a` (the baseline) and `b`, compared by `exact`.
    fn opts() -> EvalOptions {
        EvalOptions {
            selection: Selection::default(),
            run: "r".into(),
            arms: vec!["a".parse::<Arm>().unwrap(), "b".parse::<Arm>().unwrap()],
            baseline: "a".into(),
            scorers: Scorers::default(),
            judge: None,
            rate: None,
            concurrency: 1,
        }
    }

    /// An arm's scored round trips: (turn, step, `exact`), each from record 3.
    fn scored(trips: &[(&str, i32, f64)]) -> Scored {
        trips
            .iter()
            .map(|(turn, step, exact)| {
                let key = (Uuid::nil(), (*turn).to_owned(), *step);
                (key, (BTreeMap::from([("exact", *exact)]), Uuid::from_u128(3)))
            })
            .collect()
    }

    #[test]
    fn a_round_trip_an_arm_never_reached_counts_against_it() {
        // Arm a replays both round trips of t1 as the original; arm b stops after the first.
        let rows = BTreeMap::from([
            ("a".to_owned(), vec![row("t1", 0, "x", "x"), row("t1", 1, "y", "y")]),
            ("b".to_owned(), vec![row("t1", 0, "x", "x")]),
        ]);
        let report = build(&opts(), &rows, &BTreeMap::new(), &[], &BTreeMap::new());
        let b = report.arms.iter().find(|a| a.name == "b").unwrap();
        let exact = &b.versus_baseline["exact"];
        assert_eq!((exact.worse, exact.better, exact.difference.n), (1, 0, 2));
        assert_eq!(b.turns_not_run, 0);
        assert_eq!(report.regressions.len(), 1);
        assert_eq!(
            (report.regressions[0].step, report.regressions[0].arm_record),
            (1, Uuid::nil())
        );
    }

    #[test]
    fn a_turn_an_arm_never_ran_is_left_out_and_counted() {
        // Arm a replays turns A and B whole; arm b ran A and stopped after its first round trip,
        // and has nothing of B (interrupted, or its model rejected).
        let rows = BTreeMap::from([
            (
                "a".to_owned(),
                vec![
                    row("A", 0, "x", "x"),
                    row("A", 1, "y", "y"),
                    row("B", 0, "x", "x"),
                    row("B", 1, "y", "y"),
                ],
            ),
            ("b".to_owned(), vec![row("A", 0, "x", "x")]),
        ]);
        let report = build(&opts(), &rows, &BTreeMap::new(), &[], &BTreeMap::new());
        let not_run: Vec<(&str, usize)> =
            report.arms.iter().map(|a| (a.name.as_str(), a.turns_not_run)).collect();
        assert_eq!(not_run, [(ORIGINAL, 0), ("a", 0), ("b", 1)]);
        // A step 0 ties, A step 1 (never reached) scores 0, B is not compared at all.
        let exact = &report.arms[2].versus_baseline["exact"];
        assert_eq!((exact.difference.n, exact.worse, exact.better), (2, 1, 0));
        let listed: Vec<(&str, i32)> =
            report.regressions.iter().map(|r| (r.turn_id.as_str(), r.step)).collect();
        assert_eq!(listed, [("A", 1)]);
        assert!(report.to_string().contains("1 not run"), "{report}");
    }

    #[test]
    fn paired_and_worse_score_unreached_round_trips_and_skip_turns_not_run() {
        let base = scored(&[("A", 0, 1.0), ("A", 1, 1.0), ("B", 0, 1.0), ("B", 1, 1.0)]);
        let mine = scored(&[("A", 0, 1.0)]);
        let ran = turns(&mine);
        let exact = paired(&base, &mine, &ran)["exact"];
        assert_eq!((exact.difference.n, exact.worse, exact.difference.mean), (2, 1, -0.5));
        let regressions = worse("b", "exact", &base, (&mine, &ran));
        let got: Vec<_> =
            regressions.iter().map(|r| (r.turn_id.as_str(), r.step, r.arm_score)).collect();
        assert_eq!(got, [("A", 1, 0.0)]);
        assert_eq!(regressions[0].arm_record, Uuid::nil());
        // B got no answer from the arm's model: it ran, and counts against the arm.
        let mut answered_not = ran.clone();
        answered_not.insert((Uuid::nil(), "B"));
        let exact = paired(&base, &mine, &answered_not)["exact"];
        assert_eq!((exact.difference.n, exact.worse), (4, 3));
        // An arm that ran nothing is compared on nothing and regresses nowhere.
        let none = Scored::new();
        assert!(paired(&base, &none, &turns(&none)).is_empty());
        assert!(worse("b", "exact", &base, (&none, &turns(&none))).is_empty());
    }

    #[test]
    fn a_report_stored_before_turns_not_run_still_reads() {
        let rows = BTreeMap::from([("a".to_owned(), vec![row("A", 0, "x", "x")])]);
        let report = build(&opts(), &rows, &BTreeMap::new(), &[], &BTreeMap::new());
        let mut json = serde_json::to_value(&report).unwrap();
        json.as_object_mut().unwrap().remove("interrupted");
        for arm in json["arms"].as_array_mut().unwrap() {
            arm.as_object_mut().unwrap().remove("turns_not_run");
        }
        let read: EvalReport = serde_json::from_value(json).unwrap();
        assert!(!read.interrupted);
        assert!(read.arms.iter().all(|a| a.turns_not_run == 0));
    }
}
