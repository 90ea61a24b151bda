//! `aptix eval` (issue 45) on the real pipeline's stored turns: a seeded conversation replayed on
//! two arms, one worse by construction (its context caps answers at 16 output tokens, so the
//! simulator cuts them short), and the report must say so; an arm whose model the provider
//! rejects ran nothing and is left out of the comparison, not reported worse; an interrupted run
//! judges nothing and says it is partial; the command line resumes a run and prints its report
//! as JSON.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use aptix::eval::{Arm, EvalOptions, Judge, Scorers, ORIGINAL};
use aptix::reprocess::Selection;
use aptix::sim::Fault;
use common::{new_session, user_turn, Harness};
use tokio_util::sync::CancellationToken;

const TURNS: usize = 8;
/// What the judge may spend: enough for every answer of the test (24 judgements at about
/// $0.0015 each at worst).
const JUDGE_BUDGET: f64 = 0.05;

/// Eight one-turn sessions, each answered.
async fn seeded(h: &Harness) -> Vec<String> {
    let sessions: Vec<String> = (0..TURNS).map(|_| new_session()).collect();
    for (i, s) in sessions.iter().enumerate() {
        h.submit(&user_turn(s, "t1", &format!("explain part {i} of the invoice flow"))).await;
    }
    for s in &sessions {
        let got = h.replies(s, 1, Duration::from_secs(60)).await;
        assert_eq!(got[0].body["Successful"], true, "{}", got[0].body);
    }
    sessions
}

fn arm(text: &str) -> Arm {
    text.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worse_arm_is_reported_worse_and_an_unchanged_one_is_not() {
    let h = Harness::start_with(1, |s| {
        let mut terse = s.conversation_contexts["default"].clone();
        terse.max_output_tokens = Some(16);
        s.conversation_contexts.insert("terse".into(), terse);
    })
    .await;
    seeded(&h).await;
    let opts = EvalOptions {
        selection: Selection { all: true, ..Selection::default() },
        run: format!("ev-{}", h.id),
        arms: vec![arm("same"), arm("terse:context=terse")],
        baseline: ORIGINAL.into(),
        scorers: Scorers { expect: Some(regex::Regex::new("instruction: explain part").unwrap()) },
        judge: Some(Judge {
            rubric: "A good answer states the instruction it answers.".into(),
            model: "gpt-5.1".into(),
            budget_usd: Some(JUDGE_BUDGET),
        }),
        rate: None,
        concurrency: 4,
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let settings = h.settings.clone();
    let report = aptix::eval::run(&h.deps.store, settings, h.deps.llm.clone(), &opts, &cancel)
        .await
        .unwrap();
    eprintln!("{report}");
    let names: Vec<&str> = report.arms.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, [ORIGINAL, "same", "terse"]);
    let (same, terse) = (&report.arms[1], &report.arms[2]);
    assert_eq!((same.round_trips, terse.round_trips), (TURNS, TURNS));
    // The unchanged arm answers as the originals did.
    assert_eq!(same.scores["exact"].mean, 1.0, "{report}");
    assert_eq!(same.versus_baseline["regex"].p_value, 1.0);
    // The capped arm is worse on every round trip, and the sign test says it is no accident.
    let worse = &terse.versus_baseline["regex"];
    assert_eq!((worse.worse, worse.better, worse.difference.mean), (TURNS, 0, -1.0), "{report}");
    assert!(worse.p_value < 0.01, "{report}");
    assert_eq!(terse.scores["exact"].mean, 0.0);
    // It also cost less (fewer output tokens), which counts as better.
    assert!(terse.scores["cost_usd"].mean < same.scores["cost_usd"].mean, "{report}");
    assert_eq!(terse.versus_baseline["cost_usd"].better, TURNS, "{report}");
    // The judge (the simulator judges its own whole answers 1, cut ones 0) agrees, within its
    // budget, and its cost is reported.
    assert_eq!(same.scores["judge"].mean, 1.0, "{report}");
    assert_eq!(terse.scores["judge"].mean, 0.0, "{report}");
    assert_eq!(terse.versus_baseline["judge"].worse, TURNS);
    // The judge's request, for the CI's check against the official schema.
    let body = aptix::eval::judge_request(opts.judge.as_ref().unwrap(), "explain", "an answer");
    crate::assemble_support::write_request_body("eval-judge", &body.to_value());
    let judge = report.judge.as_ref().unwrap();
    assert_eq!((judge.judged, judge.unjudged), (3 * TURNS, 0), "{report}");
    assert!(judge.cost_usd > 0.0 && judge.cost_usd <= JUDGE_BUDGET, "{report}");
    assert_eq!(report.primary, "regex");
    assert_eq!(report.regressions.len(), TURNS);
    let r = &report.regressions[0];
    assert_eq!((r.arm.as_str(), r.baseline_score, r.arm_score), ("terse", 1.0, 0.0));
    assert_eq!(r.page, format!("/sessions/{}/turns/t1", r.session_id));
    assert_ne!(r.baseline_record, r.arm_record);
    // Kept for the console, as versioned JSON.
    let kept = h.deps.store.eval_runs(10).await.unwrap();
    let (run, json, _) = kept.iter().find(|(run, _, _)| *run == opts.run).unwrap();
    assert_eq!((run.as_str(), json["version"].as_u64()), (opts.run.as_str(), Some(1)));
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_arm_its_model_failed_counts_one_never_run_is_left_out_and_an_interrupted_run_judges_nothing(
) {
    let h = Harness::start(1).await;
    seeded(&h).await;
    let mut opts = EvalOptions {
        selection: Selection { all: true, ..Selection::default() },
        run: format!("ev-gone-{}", h.id),
        arms: vec![arm("control")],
        baseline: "control".into(),
        scorers: Scorers::default(),
        judge: None,
        rate: None,
        concurrency: 4,
    };
    let (store, llm) = (&h.deps.store, h.deps.llm.clone());
    let cancel = CancellationToken::new();
    aptix::eval::run(store, h.settings.clone(), llm.clone(), &opts, &cancel).await.unwrap();
    // A second arm on a model the provider does not serve: every one of its calls (one round
    // trip per turn) is refused with 404 `model_not_found`, so its turns fail and write nothing.
    // Its model gave no answer: that counts against it, each round trip at 0.
    h.sim.faults().fail_next(Fault::Status { status: 404 }, TURNS);
    opts.arms.push(arm("gone:model=gpt-retired"));
    let report =
        aptix::eval::run(store, h.settings.clone(), llm.clone(), &opts, &cancel).await.unwrap();
    assert_eq!(h.sim.faults().queued(), 0, "the arm's turns were tried: {report}");
    let not_run: Vec<(&str, usize)> =
        report.arms.iter().map(|a| (a.name.as_str(), a.turns_not_run)).collect();
    assert_eq!(not_run, [(ORIGINAL, 0), ("control", 0), ("gone", 0)]);
    let gone = &report.arms[2];
    assert_eq!((gone.round_trips, gone.turns_not_done), (0, TURNS), "{report}");
    let exact = &gone.versus_baseline["exact"];
    assert_eq!((exact.difference.n, exact.worse), (TURNS, TURNS), "{report}");
    assert!(!report.regressions.is_empty(), "{report}");
    assert!(!report.interrupted);
    // An arm whose calls the provider refuses for the account (a revoked key: 401) says
    // nothing of its model: its turns were not run, not failed by it.
    // (An evaluation of its own, the arm first: this one's `gone` arm is tried again by every
    // invocation.)
    let mut locked_run = opts.clone();
    locked_run.run = format!("ev-locked-{}", h.id);
    locked_run.arms = vec![arm("locked:model=gpt-5-mini"), arm("control")];
    h.sim.faults().fail_next(Fault::Status { status: 401 }, TURNS);
    let report = aptix::eval::run(store, h.settings.clone(), llm.clone(), &locked_run, &cancel)
        .await
        .unwrap();
    assert_eq!(h.sim.faults().queued(), 0, "the arm's turns were tried: {report}");
    let locked = report.arms.iter().find(|a| a.name == "locked").unwrap();
    assert_eq!((locked.round_trips, locked.turns_not_run), (0, TURNS), "{report}");
    assert!(locked.versus_baseline.is_empty(), "{report}");
    assert!(report.regressions.iter().all(|r| r.arm != "locked"), "{report}");
    // Interrupted (Ctrl-C before anything starts): no turn is replayed, a new arm's turns are
    // never run (left out of the comparison: they say nothing of its answers), the judge
    // judges nothing, and the report kept says it is partial.
    opts.judge =
        Some(Judge { rubric: "Be whole.".into(), model: "gpt-5.1".into(), budget_usd: None });
    opts.arms.push(arm("late:model=gpt-5-mini"));
    let calls = h.sim.requests().len();
    cancel.cancel();
    let report = aptix::eval::run(store, h.settings.clone(), llm, &opts, &cancel).await.unwrap();
    assert_eq!(h.sim.requests().len(), calls, "an interrupted run calls nothing: {report}");
    assert!(report.interrupted, "{report}");
    let late = report.arms.iter().find(|a| a.name == "late").unwrap();
    assert_eq!(late.turns_not_run, TURNS, "{report}");
    assert!(late.versus_baseline.is_empty(), "{report}");
    assert!(report.regressions.iter().all(|r| r.arm != "late"), "{report}");
    assert!(report.to_string().contains(&format!("{TURNS} not run")), "{report}");
    let judge = report.judge.as_ref().unwrap();
    assert_eq!((judge.judged, judge.unjudged, judge.cost_usd), (0, 2 * TURNS, 0.0), "{report}");
    assert_eq!(report.arms[1].round_trips, TURNS, "the records so far are still reported");
    let kept = store.eval_run(&opts.run).await.unwrap().unwrap();
    assert_eq!(kept["interrupted"], true);
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_command_line_runs_resumes_and_reports_as_json() {
    let h = Harness::start(1).await;
    let sessions = seeded(&h).await;
    let run = format!("ev-cli-{}", h.id);
    let args = ["eval", "--all", "--arm", "again", "--run", &run, "--rate", "0", "--json"];
    let (code, out) = h.aptix(&args);
    assert_eq!(code, 0, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["arms"][1]["name"], "again");
    assert!(report["arms"][1]["round_trips"].as_u64().unwrap() >= TURNS as u64, "{report}");
    let calls = h.sim.requests().len();
    // The same run again calls nothing: every arm's turns are done.
    let (code, again) = h.aptix(&args);
    assert_eq!(code, 0, "{again}");
    assert_eq!(h.sim.requests().len(), calls, "a resumed run replays nothing twice");
    // Bad options say what is wrong: a reserved arm name, or an arm resumed as another arm.
    let (code, _) = h.aptix(&["eval", "--all", "--arm", "original", "--run", &run]);
    assert_eq!(code, 2);
    let (code, _) = h.aptix(&["eval", "--all", "--arm", "again:model=other", "--run", &run]);
    assert_eq!(code, 2, "an arm resumed with another model is refused");
    assert_eq!(h.sim.requests().len(), calls);
    assert!(!sessions.is_empty());
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_judge_never_spends_more_than_its_budget() {
    let h = Harness::start(1).await;
    seeded(&h).await;
    // One judgement may cost about $0.0043 at worst and $0.0005 in fact: room for a few.
    let budget = 0.006;
    let opts = EvalOptions {
        selection: Selection { all: true, ..Selection::default() },
        run: format!("ev-budget-{}", h.id),
        arms: vec![arm("again")],
        baseline: ORIGINAL.into(),
        scorers: Scorers::default(),
        judge: Some(Judge {
            rubric: "Be whole.".into(),
            model: "gpt-5.1".into(),
            budget_usd: Some(budget),
        }),
        rate: None,
        concurrency: 4,
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let report =
        aptix::eval::run(&h.deps.store, h.settings.clone(), h.deps.llm.clone(), &opts, &cancel)
            .await
            .unwrap();
    let judge = report.judge.unwrap();
    // Sixteen answers to judge; the budget pays for a few: the rest are left, none overspent.
    assert!(judge.judged > 0 && judge.unjudged > 0, "{judge:?}");
    assert_eq!(judge.judged + judge.unjudged, 2 * TURNS);
    assert!(judge.cost_usd <= budget, "{judge:?}");
    h.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_round_trip_no_replay_reached_counts_against_the_arm() {
    let h = Harness::start_with(1, |s| {
        // A context that offers no tools: the replay answers at once, so the original's
        // second round trip (after the tool's result) is never reached.
        let mut bare = s.conversation_contexts["default"].clone();
        bare.tools.clear();
        s.conversation_contexts.insert("bare".into(), bare);
    })
    .await;
    let s = new_session();
    h.submit(&user_turn(&s, "t1", "Read the file @call(read_file)")).await;
    let first = h.replies(&s, 1, Duration::from_secs(60)).await;
    let asked = first.iter().rfind(|r| r.is_final).unwrap();
    assert_eq!(asked.body["Result"]["Kind"], "client_tool_continuation", "{}", asked.body);
    let call = asked.body["Result"]["ToolCalls"][0]["ToolCallId"].clone();
    h.submit(&serde_json::json!({"SessionId": s, "TurnId": "t1",
        "ToolResults": [{"ToolCallId": call, "ExecutionMs": 3, "ResultJson": "{}"}]}))
        .await;
    let done = h.replies(&s, 1, Duration::from_secs(60)).await;
    assert_eq!(done.iter().rfind(|r| r.is_final).unwrap().body["Result"]["Kind"], "final");

    let opts = EvalOptions {
        selection: Selection { session: Some(s.parse().unwrap()), ..Selection::default() },
        run: format!("ev-bare-{}", h.id),
        arms: vec![arm("bare:context=bare")],
        baseline: ORIGINAL.into(),
        scorers: Scorers::default(),
        judge: None,
        rate: None,
        concurrency: 1,
    };
    let cancel = CancellationToken::new();
    let report =
        aptix::eval::run(&h.deps.store, h.settings.clone(), h.deps.llm.clone(), &opts, &cancel)
            .await
            .unwrap();
    // The baseline has both of the turn's round trips, not only the one the replay reached,
    // and the arm scores 0 on the one it never reached.
    assert_eq!(report.arms[0].round_trips, 2, "{report}");
    let bare = report.arms.iter().find(|a| a.name == "bare").unwrap();
    assert_eq!(bare.round_trips, 1, "{report}");
    let exact = &bare.versus_baseline["exact"];
    assert_eq!((exact.difference.n, exact.worse), (2, 2), "{report}");
    h.teardown().await;
}
