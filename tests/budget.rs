//! Money budgets (issue 45, docs/tenancy.md §7a) on the real broker and database: every call
//! reserves its worst case before it is made and settles to its priced usage, so a tenant's or
//! a context's spend never passes its budget — with several invoke workers, concurrent
//! publishers, and streamed turns cancelled mid-call.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::tenancy;
use crate::tenant_support;

use aptix::config::{Settings, TenantLimits, Usd};
use std::time::Duration;

use aptix::sim::Latency;
use common::{new_session, user_turn};
use serde_json::json;
use tenant_support::codes;

/// Output tokens a call of the test contexts may produce: a small cap keeps the worst case near
/// a real call's cost, so a budget holds a handful of turns.
const CAP: u32 = 256;

fn usd(dollars: f64) -> Usd {
    serde_json::from_value(json!(dollars)).unwrap()
}

/// Both tenants under `limits`, every context capped (a budget requires it).
fn budgeted(s: &mut Settings, limits: TenantLimits) {
    s.conversation_contexts.get_mut("default").unwrap().max_output_tokens = Some(CAP);
    tenancy::tenants(s, limits);
}

/// Tenant `ta`'s spend: settled and reserved together, and settled alone, in micro-dollars.
async fn spend(t: &tenancy::Two, tenant: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT COALESCE(sum(COALESCE(cost_micros, reserved_micros)), 0)::bigint,
                COALESCE(sum(cost_micros), 0)::bigint,
                count(*) FILTER (WHERE cost_micros IS NULL)
         FROM spend WHERE tenant = $1",
    )
    .bind(tenant)
    .fetch_one(t.h.deps.store.pool())
    .await
    .unwrap()
}

/// What the recorded usage of `tenant`'s calls costs at the configured price, in micro-dollars:
/// an independent reading of what the provider reported.
async fn recorded_cost(t: &tenancy::Two, tenant: &str) -> u64 {
    let usages: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT r.usage FROM response_records r JOIN sessions s ON s.id = r.session_id
         WHERE s.tenant = $1 AND r.usage IS NOT NULL",
    )
    .bind(tenant)
    .fetch_all(t.h.deps.store.pool())
    .await
    .unwrap();
    let price = t.h.deps.settings.price_of("gpt-5.1").unwrap().clone();
    usages.into_iter().map(|u| price.cost(&serde_json::from_value(u).unwrap()).micros()).sum()
}

#[tokio::test]
async fn concurrent_turns_never_pass_the_money_budget() {
    const BUDGET: f64 = 0.02;
    let limits = TenantLimits { usd_per_day: usd(BUDGET), ..Default::default() };
    let t = tenancy::start_with(3, |s| budgeted(s, limits)).await;
    t.h.sim.set_latency(Latency { fixed_ms: 300, ..Default::default() });
    let instruction = "spend ".repeat(400);
    // What one such turn costs, from the other tenant (a budget of its own).
    let probe = new_session();
    t.b.submit(&user_turn(&probe, "t1", &instruction)).await;
    let got = t.b.read(&t.b.queue(&probe), 1, tenancy::WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
    let one_turn = recorded_cost(&t, "tb").await;
    let outcomes = tenancy::cancelling_flood(&t.a, &instruction).await;
    let (total, settled, open) = spend(&t, "ta").await;
    let recorded = recorded_cost(&t, "ta").await;
    let budget = usd(BUDGET).micros();
    let report = format!(
        "spend {total} µ$ ({settled} settled, {open} open), recorded usage {recorded} µ$, \
         one turn {one_turn} µ$, budget {budget} µ$, {outcomes:?}"
    );
    eprintln!("{report}");
    assert!(u64::try_from(total).unwrap() <= budget, "the budget was passed: {report}");
    assert!(recorded <= u64::try_from(total).unwrap(), "spend under-counts usage: {report}");
    assert!(outcomes.get("limit.budget_exhausted").is_some_and(|n| *n > 0), "{report}");
    // The test can fail: all 16 turns would have cost more than the budget.
    assert!(16 * one_turn > budget, "turns too small to tell: {report}");
    tenancy::stop(t).await;
}

#[tokio::test]
async fn a_call_that_could_pass_the_budget_is_not_made() {
    // A first run, under a budget it cannot reach, gives a call's worst case and its cost.
    let ample = TenantLimits { usd_per_day: usd(1000.0), ..Default::default() };
    let probe = tenancy::start_with(1, |s| budgeted(s, ample)).await;
    let s = new_session();
    probe.a.submit(&user_turn(&s, "t1", "spend")).await;
    probe.a.read(&probe.a.queue(&s), 1, tenancy::WAIT).await;
    let one_turn = recorded_cost(&probe, "ta").await;
    let worst: i64 = sqlx::query_scalar("SELECT max(reserved_micros) FROM spend")
        .fetch_one(probe.h.deps.store.pool())
        .await
        .unwrap();
    tenancy::stop(probe).await;

    // Room for one call's worst case, not for a second one's after the first's real cost.
    let room = u64::try_from(worst).unwrap() + one_turn / 2;
    let limits = TenantLimits { usd_per_day: Usd::from_micros(room), ..Default::default() };
    let t = tenancy::start_with(1, |s| budgeted(s, limits)).await;
    let s = new_session();
    t.a.submit(&user_turn(&s, "t1", "spend")).await;
    let got = t.a.read(&t.a.queue(&s), 1, tenancy::WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
    let calls = t.h.sim.requests().len();
    t.a.submit(&user_turn(&s, "t2", "spend")).await;
    let got = t.a.read(&t.a.queue(&s), 1, tenancy::WAIT).await;
    assert_eq!(codes(&got[0]), ["limit.budget_exhausted"], "{}", got[0].body);
    let message = got[0].body["Errors"][0]["Message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("tenant ta") && message.contains("per day"), "{message}");
    assert_eq!(t.h.sim.requests().len(), calls, "the refused call was not made");
    let (total, settled, open) = spend(&t, "ta").await;
    assert_eq!((total, open), (settled, 0), "nothing left reserved");
    assert!(u64::try_from(total).unwrap() <= limits.usd_per_day.micros());
    // What `aptix status` and the gauges read is what the rows say.
    let uses = aptix::budgets::read(&t.h.deps.settings, &t.h.deps.store).await.unwrap();
    let mut ta = uses.into_iter().find(|u| u.scope == "tenant" && u.name == "ta").unwrap();
    assert_eq!((ta.budget.per_day, ta.spent.day.micros()), (limits.usd_per_day, total as u64));
    // Under a name of its own: the metrics are the process's, shared with concurrent tests.
    ta.name = format!("ta-{}", t.h.id);
    ta.export();
    let text = aptix::metrics::metrics().encode();
    let series = |metric: &str, value: u64| {
        format!("aptix_{metric}{{scope=\"tenant\",name=\"{}\",period=\"day\"}} {value}", ta.name)
    };
    for (metric, value) in [
        ("budget_ceiling_micro_usd", room),
        ("budget_spent_micro_usd", total as u64),
        ("budget_reserved_micro_usd", 0),
    ] {
        assert!(text.contains(&series(metric, value)), "{} missing", series(metric, value));
    }
    tenancy::stop(t).await;
}

#[tokio::test]
async fn a_contexts_budget_counts_every_tenant() {
    let t = tenancy::start_with(1, |s| {
        let default = s.conversation_contexts.get_mut("default").unwrap();
        default.max_output_tokens = Some(CAP);
        default.usd_per_month = Usd::from_micros(1);
        tenancy::tenants(s, TenantLimits::default());
    })
    .await;
    for (client, session) in [(&t.a, new_session()), (&t.b, new_session())] {
        client.submit(&user_turn(&session, "t1", "spend")).await;
        let got = client.read(&client.queue(&session), 1, tenancy::WAIT).await;
        assert_eq!(codes(&got[0]), ["limit.budget_exhausted"], "{}", got[0].body);
        let message = got[0].body["Errors"][0]["Message"].as_str().unwrap_or_default();
        assert!(message.contains("ConversationContext default"), "{message}");
    }
    assert_eq!(t.h.sim.requests().len(), 0, "no call was made");
    tenancy::stop(t).await;
}

#[tokio::test]
async fn with_queue_a_turn_over_a_spent_budget_is_held_until_there_is_room() {
    let limits = TenantLimits {
        usd_per_day: usd(1.0),
        over_limit: aptix::config::OverLimit::Queue,
        ..Default::default()
    };
    let t = tenancy::start_with(1, |s| budgeted(s, limits)).await;
    let pool = t.h.deps.store.pool();
    // Spent earlier today: the whole budget.
    let earlier = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO spend (tenant, context, session_id, turn_id, step, reserved_micros, cost_micros)
         VALUES ('ta', 'default', $1, 'earlier', 0, 1000000, 1000000)",
    )
    .bind(earlier)
    .execute(pool)
    .await
    .unwrap();
    let s = new_session();
    t.a.submit(&user_turn(&s, "t1", "spend")).await;
    let got = t.a.read(&t.a.queue(&s), 1, Duration::from_secs(2)).await;
    assert!(got.is_empty(), "held, so no reply yet: {got:?}");
    let state: String = sqlx::query_scalar("SELECT state FROM turns WHERE session_id = $1::uuid")
        .bind(&s)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(state, "queued");
    // The period turns: the earlier spend no longer counts, and the held turn starts.
    sqlx::query("DELETE FROM spend WHERE session_id = $1")
        .bind(earlier)
        .execute(pool)
        .await
        .unwrap();
    let got = t.a.read(&t.a.queue(&s), 1, tenancy::WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
    tenancy::stop(t).await;
}

#[tokio::test]
async fn every_attempt_of_a_call_counts_whole_until_its_round_trip_settles() {
    let limits = TenantLimits { usd_per_day: usd(1.0), ..Default::default() };
    let t = tenancy::start_with(1, |s| budgeted(s, limits)).await;
    let key = aptix::contracts::TurnKey {
        session_id: new_session().parse().unwrap(),
        turn_id: "t1".parse().unwrap(),
    };
    let tenant: aptix::contracts::TenantName = "ta".parse().unwrap();
    let attempt = aptix::store::CallReservation {
        key: &key,
        step: 0,
        tenant: Some((&tenant, limits.budget())),
        context: ("default", aptix::config::Budget::default()),
        worst: Usd::from_micros(300_000),
    };
    // Three attempts of one call (its worker died twice in it): each may have been billed, so
    // the earlier ones settle at their reservation and the three fill $0.90 of the $1.
    for _ in 0..3 {
        t.h.deps.store.reserve_call(&attempt).await.unwrap().unwrap();
    }
    assert_eq!(spend(&t, "tenant-ta-alias").await, (0, 0, 0), "spend is per tenant");
    assert_eq!(spend(&t, "ta").await, (900_000, 600_000, 1));
    // A fourth does not fit: refused, nothing reserved, the open one now settled as spent.
    let refused = t.h.deps.store.reserve_call(&attempt).await.unwrap().unwrap_err();
    assert_eq!((refused.spent.micros(), refused.open.micros()), (900_000, 0), "{refused:?}");
    assert_eq!(spend(&t, "ta").await, (900_000, 900_000, 0));
    tenancy::stop(t).await;
}

/// A chain the provider lost (`previous_response_not_found`, a 400 it does not bill) is rebuilt
/// and called again under a reservation of its own: the refused call's reservation settles at
/// nothing, so the round trip is charged only what the rebuilt call cost.
#[tokio::test]
async fn a_call_refused_for_a_lost_chain_is_not_charged() {
    let limits = TenantLimits { usd_per_day: usd(1000.0), ..Default::default() };
    let t = tenancy::start_with(1, |s| budgeted(s, limits)).await;
    let s = new_session();
    for (turn, forget) in [("t1", false), ("t2", true)] {
        if forget {
            t.h.sim.forget_stored_responses();
        }
        t.a.submit(&user_turn(&s, turn, "spend")).await;
        let got = t.a.read(&t.a.queue(&s), 1, tenancy::WAIT).await;
        assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
    }
    assert_eq!(t.h.sim.stats().requests, 3, "t2's chain was lost, then rebuilt");
    let (total, settled, open) = spend(&t, "ta").await;
    let recorded = recorded_cost(&t, "ta").await;
    assert_eq!(open, 0);
    assert_eq!(u64::try_from(settled).unwrap(), recorded, "spend {total} µ$, usage {recorded} µ$");
    tenancy::stop(t).await;
}
