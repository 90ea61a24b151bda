//! Issue 17 on the real broker and database: two tenants, each a RabbitMQ user of its own with
//! the permissions docs/tenancy.md gives; tenant B tries to continue, duplicate and answer the
//! tool call of A's session, to use A's context and to read A's reply queue — each refused,
//! nothing of A's session stored, read or leaked; the tenant's limits hold with several
//! workers and concurrent publishers; a tenant's key reaches only its own endpoint.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::tenant_support;

use std::collections::BTreeMap;
use std::time::Duration;

use aptix::config::{AgentContext, OverLimit, Settings, Tenant, TenantLimits};
use aptix::sim::Latency;
use common::{new_session, user_turn, Harness};
use serde_json::json;
use tenant_support::{codes, create_user, delete_user, TenantClient};

pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// Two tenants: `ta` (users `<prefix>-a`) with the `default` agent context (and `a2`), `tb` with `bctx`
/// (its own collection and endpoint key); both may use the `default` conversation context, `ta`
/// also `other`.
pub(crate) fn tenants(s: &mut Settings, limits: TenantLimits) {
    let prefix = s.amqp.prefix.clone();
    let other = s.conversation_contexts["default"].clone();
    s.conversation_contexts.insert("other".into(), other);
    let b: AgentContext = serde_json::from_value(json!({
        "collection": "bcol", "llm_api_key": "sk-tenant-b-secret-0042",
    }))
    .unwrap();
    s.agent_contexts.insert("bctx".into(), b);
    let a2: AgentContext = serde_json::from_value(json!({ "collection": "a2col" })).unwrap();
    s.agent_contexts.insert("a2".into(), a2);
    let tenant = |user: String, agents: &[&str], convs: &[&str]| Tenant {
        users: vec![user],
        agent_contexts: agents.iter().map(|a| a.to_string()).collect(),
        conversation_contexts: convs.iter().map(|a| a.to_string()).collect(),
        limits: Default::default(),
    };
    s.tenants = BTreeMap::from([
        ("ta".into(), tenant(format!("{prefix}-a"), &["default", "a2"], &["default", "other"])),
        ("tb".into(), tenant(format!("{prefix}-b"), &["bctx"], &["default"])),
    ]);
    s.tenant_limits = limits;
    s.validate().unwrap();
}

pub(crate) struct Two {
    pub(crate) h: Harness,
    pub(crate) a: TenantClient,
    pub(crate) b: TenantClient,
}

async fn start(copies: usize, limits: TenantLimits) -> Two {
    start_with(copies, |s| tenants(s, limits)).await
}

/// Both tenants' clients on a harness whose settings `configure` writes (it calls [`tenants`]).
pub(crate) async fn start_with(copies: usize, configure: impl FnOnce(&mut Settings)) -> Two {
    let h = Harness::start_with(copies, configure).await;
    let prefix = h.topology.prefix().to_owned();
    let mut clients = Vec::new();
    for (t, tenant) in [("a", "ta"), ("b", "tb")] {
        let user = format!("{prefix}-{t}");
        create_user(&user, "pw-test", &prefix, tenant);
        clients.push(TenantClient::connect(&user, "pw-test", tenant, &prefix).await);
    }
    let b = clients.pop().unwrap();
    let a = clients.pop().unwrap();
    Two { h, a, b }
}

pub(crate) async fn stop(t: Two) {
    let users = [t.a.user.clone(), t.b.user.clone()];
    t.a.close().await;
    t.b.close().await;
    t.h.teardown().await;
    users.iter().for_each(|u| delete_user(u));
}

async fn count(h: &Harness, sql: &str, session: &str) -> i64 {
    sqlx::query_scalar(sql).bind(session).fetch_one(h.deps.store.pool()).await.unwrap()
}

#[tokio::test]
async fn a_tenant_reaches_only_its_own_sessions_contexts_and_queues() {
    let t = start(1, TenantLimits::default()).await;
    let s = new_session();
    let mut first = user_turn(&s, "t1", "@call(run_tests) what is in the sample repo?");
    first["Stream"] = json!(false);
    t.a.submit(&first).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(got.len(), 1, "A's turn ends in a tool call on A's own queue");
    assert_eq!(got[0].headers["x-aptix-outcome"], "client_tool_continuation");
    let call = got[0].body["Result"]["ToolCalls"][0]["ToolCallId"].as_str().unwrap().to_owned();

    // B: a new turn, a duplicate of A's, and A's tool results, for A's session.
    let results = json!({"SessionId": s, "TurnId": "t1",
        "ToolResults": [{"ToolCallId": call, "ExecutionMs": 1, "ResultJson": "{\"ok\":false}"}]});
    for request in [user_turn(&s, "t2", "mine now"), first.clone(), results.clone()] {
        t.b.submit(&request).await;
        let got = t.b.read(&t.b.queue(&s), 1, WAIT).await;
        assert_eq!(got.len(), 1, "B gets an answer on its own queue");
        assert_eq!(codes(&got[0]), ["session.unavailable"], "{}", got[0].body);
        assert!(!got[0].body.to_string().contains("run_tests"), "nothing of A's session leaks");
    }
    // B cannot read A's queue; A's queue got nothing of B's; nothing was stored against A's
    // session (no turn, no refusal).
    assert!(t.b.consume_refused(&t.a.queue(&s)).await, "the broker refuses B on A's queue");
    assert!(t.a.read(&t.a.queue(&s), 1, Duration::from_millis(500)).await.is_empty());
    let h = &t.h;
    assert_eq!(count(h, "SELECT count(*) FROM turns WHERE session_id = $1::uuid", &s).await, 1);
    assert_eq!(count(h, "SELECT count(*) FROM replies WHERE session_id = $1::uuid", &s).await, 0);

    // A's own tool results still resume its turn.
    t.a.submit(&results).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);

    // A session's AgentContext is fixed at creation; its mode (ConversationContext) is the turn's.
    let mut elsewhere = user_turn(&s, "t3", "same session, other endpoint");
    elsewhere["AgentContextId"] = json!("a2");
    t.a.submit(&elsewhere).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(codes(&got[0]), ["session.context_fixed"]);
    let mut switch = user_turn(&s, "t4", "same session, other profile");
    switch["ConversationContextId"] = json!("other");
    t.a.submit(&switch).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
    // A later turn that names no context uses the session's, not the tenant's default.
    let s4 = new_session();
    let mut first_other = user_turn(&s4, "t1", "in the other profile");
    first_other["ConversationContextId"] = json!("other");
    t.a.submit(&first_other).await;
    t.a.submit(&user_turn(&s4, "t2", "still there")).await;
    let got = t.a.read(&t.a.queue(&s4), 2, WAIT).await;
    assert!(got.iter().all(|r| r.headers["x-aptix-outcome"] == "final"), "{got:?}");
    let used: String = sqlx::query_scalar(
        "SELECT request->>'ConversationContextId' FROM turns WHERE session_id = $1::uuid AND turn_id = 't2'",
    )
    .bind(&s4)
    .fetch_one(t.h.deps.store.pool())
    .await
    .unwrap();
    assert_eq!(used, "other");

    // B naming A's agent context, or a conversation context that is not B's, gets what an
    // unknown one gets, and no session is created.
    let s2 = new_session();
    let mut theirs = user_turn(&s2, "t1", "use their code");
    theirs["AgentContextId"] = json!("default");
    theirs["ConversationContextId"] = json!("other");
    t.b.submit(&theirs).await;
    let got = t.b.read(&t.b.queue(&s2), 1, WAIT).await;
    let mut got_codes = codes(&got[0]);
    got_codes.sort();
    assert_eq!(
        got_codes,
        ["context.unknown_agent_context", "context.unknown_conversation_context"]
    );
    assert!(got[0].body.to_string().contains("no agent context `default` is configured"));
    assert_eq!(count(h, "SELECT count(*) FROM sessions WHERE id = $1::uuid", &s2).await, 0);

    // B's own session runs on B's context; B's key is never stored or replied.
    let s3 = new_session();
    t.b.submit(&user_turn(&s3, "t1", "hello")).await;
    let got = t.b.read(&t.b.queue(&s3), 1, WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
    assert!(!got[0].body.to_string().contains("sk-tenant-b"));
    let leaked: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM sessions x WHERE to_jsonb(x)::text LIKE '%sk-tenant-b%')
              + (SELECT count(*) FROM turns x WHERE to_jsonb(x)::text LIKE '%sk-tenant-b%')
              + (SELECT count(*) FROM response_records x WHERE to_jsonb(x)::text LIKE '%sk-tenant-b%')
              + (SELECT count(*) FROM replies x WHERE to_jsonb(x)::text LIKE '%sk-tenant-b%')",
    )
    .fetch_one(h.deps.store.pool())
    .await
    .unwrap();
    assert_eq!(leaked, 0, "a tenant's key is stored nowhere");
    stop(t).await;
}

/// `aptix submit --tenant` publishes as the docs say a tenant's client does, and waits on the
/// tenant's reply queue.
#[tokio::test]
async fn aptix_submit_publishes_for_a_tenant() {
    let t = start(1, TenantLimits::default()).await;
    let s = new_session();
    let file = t.h.dir.join("request.json");
    std::fs::write(&file, serde_json::to_vec(&user_turn(&s, "t1", "hello")).unwrap()).unwrap();
    let url = format!("amqp://{}:pw-test@127.0.0.1:5672/%2f", t.a.user);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_aptix"))
        .args(["submit", "--wait", "--timeout", "30", "--tenant", "ta"])
        .arg(&file)
        .env_remove("APTIX_CONFIG")
        .envs(t.h.child_env())
        .env("APTIX__AMQP__URL", url)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("\"Successful\":true"), "{stdout}");
    stop(t).await;
}

/// A request without `user_id`, or from a user of no tenant, has nobody to be answered: it is
/// dead-lettered with the reason, and nothing is stored.
#[tokio::test]
async fn a_publisher_of_no_tenant_is_dead_lettered() {
    let t = start(1, TenantLimits::default()).await;
    let s = new_session();
    t.a.declare(&s).await;
    t.a.publish_as(&user_turn(&s, "t1", "who am I?"), None).await;
    // As `guest`, a user of no tenant, with its (broker-checked) user_id.
    let body = serde_json::to_vec(&user_turn(&s, "t2", "guest")).unwrap();
    let mut msg = t.h.topology.request(&s, uuid::Uuid::new_v4().to_string(), body);
    msg.user_id = Some("guest".into());
    t.h.publisher.publish(&msg).await.unwrap();
    let mut dead = Vec::new();
    for _ in 0..100 {
        dead.extend(t.h.dead_letters().await);
        if dead.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 2, "both are dead-lettered");
    for (headers, _) in &dead {
        let reason = headers.values().find(|v| v.contains("request.tenant_unknown"));
        assert!(reason.is_some(), "{headers:?}");
    }
    // The dead copy keeps who published the original, when the broker said.
    let users: Vec<_> = dead.iter().filter_map(|(h, _)| h.get("x-aptix-user-id")).collect();
    assert_eq!(users, ["guest"], "guest said who it is; A's client without user_id did not");
    assert_eq!(count(&t.h, "SELECT count(*) FROM sessions WHERE id = $1::uuid", &s).await, 0);
    stop(t).await;
}

/// `rabbitmqctl` with `args`, which must succeed.
fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl").arg("-q").args(args).output().unwrap();
    assert!(out.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Each tenant's dead letters and unrouted replies are kept in queues of its own, so a flood
/// of one tenant's evicts only its own; a message no tenant is known for goes to the shared
/// queue. `ta`'s queue gets a bound of 5 (instead of setup.sh's 10,000) so 20 fill it.
#[tokio::test]
async fn a_tenants_flood_of_dead_letters_evicts_only_its_own() {
    let t = start(1, TenantLimits::default()).await;
    let topology = t.h.topology.clone();
    let (ta, tb) = ("ta".parse().unwrap(), "tb".parse().unwrap());
    let policy = format!("{}-test-dead-ta", topology.prefix());
    let pattern = format!("^{}$", topology.dead_of(Some(&ta)).replace('.', "\\."));
    let bound = r#"{"max-length": 5, "overflow": "drop-head"}"#;
    rabbitmqctl(&[
        "set_policy",
        "--priority",
        "10",
        "--apply-to",
        "queues",
        &policy,
        &pattern,
        bound,
    ]);
    t.b.publish_raw(b"{\"not\": \"a request of tb\"}").await;
    t.a.publish_as(&json!({"not": "anyone's"}), None).await;
    for i in 0..20 {
        t.a.publish_raw(format!("{{\"flood\": {i}}}").as_bytes()).await;
    }
    // A refusal for a session whose queue nobody declared: kept in ta's unrouted queue.
    let s = new_session();
    t.a.publish_as(&json!({"SessionId": s, "TurnId": "x"}), Some(&t.a.user)).await;
    // Validate handles messages that name no session concurrently, so the flood's letters may
    // land in any order: wait until every queue has what it should, then for stragglers.
    let expected = [
        (topology.dead_of(Some(&ta)), 5),
        (topology.dead_of(Some(&tb)), 1),
        (topology.dead(), 1),
        (topology.unrouted_of(Some(&ta)), 1),
        (topology.requests(), 0),
    ];
    for _ in 0..200 {
        let mut counts = Vec::new();
        for (queue, _) in &expected {
            counts.push(t.h.peek_count(queue).await);
        }
        if expected.iter().zip(&counts).all(|((_, want), got)| want == got) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let own = t.h.take_all(&topology.dead_of(Some(&ta))).await;
    let unrouted = t.h.take_all(&topology.unrouted_of(Some(&ta))).await;
    assert_eq!(own.len(), 5, "ta's own queue keeps 5 of its 20");
    for (headers, body) in &own {
        assert!(body.starts_with(b"{\"flood\": "), "only ta's flood: {body:?}");
        assert_eq!(headers["x-aptix-user-id"], t.a.user);
    }
    let theirs = t.h.take_all(&topology.dead_of(Some(&tb))).await;
    assert_eq!(theirs.len(), 1, "tb's dead letter survived ta's flood");
    assert_eq!(theirs[0].1, b"{\"not\": \"a request of tb\"}");
    assert_eq!(theirs[0].0["x-aptix-user-id"], t.b.user);
    let shared = t.h.take_all(&topology.dead()).await;
    assert_eq!(shared.len(), 1, "only the message of no tenant is in the shared queue: {shared:?}");
    assert!(shared[0].0["x-aptix-reason"].contains("request.tenant_unknown"));
    assert_eq!(unrouted.len(), 1, "the refusal is kept in ta's unrouted queue");
    assert_eq!(unrouted[0].0["x-aptix-unrouted-routing-key"], format!("ta.{s}"));
    assert!(t.h.take_all(&topology.unrouted_of(Some(&tb))).await.is_empty());
    rabbitmqctl(&["clear_policy", &policy]);
    stop(t).await;
}

/// Stored refusals are bounded per tenant: a tenant at its quota that is refused again loses
/// its own oldest refusal, and another tenant's stay.
#[tokio::test]
async fn stored_refusals_are_bounded_per_tenant() {
    let h = Harness::start(0).await;
    let (store, max) = (&h.deps.store, aptix::store::MAX_STORED_REFUSALS_PER_TENANT);
    // `greedy` at its quota (the oldest first), `other` with a handful.
    sqlx::query(
        "INSERT INTO replies (message_id, session_id, turn_id, outcome, body, tenant, created_at)
         SELECT 'g' || i, gen_random_uuid(), NULL, 'refused', '{}'::jsonb, 'greedy',
                now() - interval '1 hour' + i * interval '1 ms' FROM generate_series(1, $1) AS i
         UNION ALL SELECT 'o' || i, gen_random_uuid(), NULL, 'refused', '{}'::jsonb, 'other',
                now() - interval '2 hours' FROM generate_series(1, 5) AS i",
    )
    .bind(max)
    .execute(store.pool())
    .await
    .unwrap();
    let counted = "INSERT INTO reply_counts VALUES ('greedy', $1), ('other', 5)";
    sqlx::query(counted).bind(max).execute(store.pool()).await.unwrap();
    let session: aptix::contracts::SessionId = new_session().parse().unwrap();
    let body = json!({"Errors": []});
    let (greedy, other) = ("greedy".parse().unwrap(), "other".parse().unwrap());
    let refusal = |id: &'static str, tenant| aptix::store::StoredReply {
        message_id: id,
        session: &session,
        turn_id: None,
        outcome: aptix::messages::ReplyOutcome::Refused,
        body: aptix::store::StoredBody::AsSent(&body),
        tenant: Some(tenant),
    };
    store.save_reply(&refusal("g-new", &greedy)).await.unwrap();
    store.save_reply(&refusal("g-new", &greedy)).await.unwrap(); // a copy stores nothing
    store.save_reply(&refusal("o-new", &other)).await.unwrap();
    let of = |tenant: &str| {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM replies WHERE tenant = $1")
            .bind(tenant.to_owned())
            .fetch_one(store.pool())
    };
    assert_eq!(of("greedy").await.unwrap(), max, "greedy stays at its quota");
    assert_eq!(of("other").await.unwrap(), 6, "other keeps all of its own");
    let oldest_left: bool =
        sqlx::query_scalar("SELECT exists(SELECT 1 FROM replies WHERE message_id = 'g1')")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert!(!oldest_left, "greedy's oldest went");
    let counts: Vec<(String, i64)> =
        sqlx::query_as("SELECT tenant, n FROM reply_counts ORDER BY tenant")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(counts, [("greedy".to_owned(), max), ("other".to_owned(), 6)]);
    h.teardown().await;
}

/// Tokens are reserved before the call (docs/tenancy.md §7): three workers of every stage, four
/// publishers, 16 turns at once (every fourth streamed and cancelled at once), and what the
/// window is charged stays within `tokens_per_minute` plus one reservation. Without reserving,
/// every turn would be admitted before the first is charged, and the 16 would spend far more.
#[tokio::test]
async fn concurrent_turns_cannot_overshoot_the_token_budget() {
    const LIMIT: u64 = 3_000;
    let t = start(3, TenantLimits { tokens_per_minute: LIMIT, ..Default::default() }).await;
    t.h.sim.set_latency(Latency { fixed_ms: 300, ..Default::default() });
    let instruction = "spend ".repeat(400);
    // What one such turn costs, from the other tenant (a budget of its own).
    let probe = new_session();
    t.b.submit(&user_turn(&probe, "t1", &instruction)).await;
    let got = t.b.read(&t.b.queue(&probe), 1, WAIT).await;
    let one_turn = got[0].body["Result"]["Usage"]["TotalTokens"].as_i64().expect("usage");
    let outcomes = cancelling_flood(&t.a, &instruction).await;
    let (charged, largest): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE(sum(tokens), 0)::bigint, COALESCE(max(tokens), 0)::bigint
         FROM tenant_tokens WHERE tenant = 'ta'",
    )
    .fetch_one(t.h.deps.store.pool())
    .await
    .unwrap();
    // One reservation: at least MIN_TOKEN_RESERVE, at least one such turn.
    let reserve = aptix::store::MIN_TOKEN_RESERVE.max(largest).max(one_turn);
    let limit = i64::try_from(LIMIT).unwrap();
    let report = format!("charged {charged}, largest {largest}, one turn {one_turn}, {outcomes:?}");
    eprintln!("{report}");
    assert!(charged <= limit + reserve, "the window overshot: {report}");
    assert!(outcomes.get("limit.tokens_per_minute").is_some_and(|n| *n > 0), "{report}");
    // The test can fail: had all 16 run, as they would without reserving, they would have
    // spent more than the bound (the cancelled ones aside).
    assert!(12 * one_turn > limit + reserve, "turns too small to tell: {report}");
    stop(t).await;
}

/// Sixteen one-turn sessions of `instruction` from four concurrent publishers, the first of each
/// publisher's turns streamed and cancelled at once; every session's final answer, counted by
/// outcome (`final` or its error codes).
pub(crate) async fn cancelling_flood(
    client: &TenantClient,
    instruction: &str,
) -> BTreeMap<String, usize> {
    let sessions: Vec<String> = (0..16).map(|_| new_session()).collect();
    let sends = sessions.chunks(4).map(|chunk| {
        let a = client;
        async move {
            for (i, s) in chunk.iter().enumerate() {
                let mut turn = user_turn(s, "t1", instruction);
                turn["Stream"] = json!(i == 0);
                a.submit(&turn).await;
                if i == 0 {
                    a.cancel(s, "t1").await;
                }
            }
        }
    });
    futures_util::future::join_all(sends).await;
    let mut outcomes = BTreeMap::<String, usize>::new();
    for s in &sessions {
        let got = client.read(&client.queue(s), 1, Duration::from_secs(60)).await;
        let last = got.last().expect("every turn gets an answer");
        assert!(last.is_final, "{last:?}");
        let outcome = match last.headers["x-aptix-outcome"].as_str() {
            "final" => "final".to_owned(),
            _ => codes(last).join(","),
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    outcomes
}

/// The largest number of turns of tenant `ta` that were in flight at once, from the stored
/// turns: each counts from `from` (its admission or its start) to its end.
async fn peak(h: &Harness, from: &str) -> i64 {
    let sql = format!(
        "WITH spans AS (SELECT {from} AS s, updated_at AS e FROM turns
                        WHERE tenant = 'ta' AND state IN ('completed', 'failed'))
         SELECT COALESCE(max((SELECT count(*) FROM spans o WHERE o.s <= x.s AND o.e > x.s)), 0)
         FROM spans x"
    );
    sqlx::query_scalar(&sql).fetch_one(h.deps.store.pool()).await.unwrap()
}

/// Sends `n` one-turn sessions from `publishers` concurrent publishers of tenant A and reads
/// every answer; returns (finals, refusals by code).
async fn flood(t: &Two, publishers: usize, n: usize) -> (usize, BTreeMap<String, usize>) {
    let sessions: Vec<String> = (0..n).map(|_| new_session()).collect();
    let chunks: Vec<Vec<String>> =
        sessions.chunks(n.div_ceil(publishers)).map(<[String]>::to_vec).collect();
    let sends = chunks.iter().map(|chunk| async move {
        for s in chunk {
            t.a.submit(&user_turn(s, "t1", "count me")).await;
        }
    });
    futures_util::future::join_all(sends).await;
    let (mut finals, mut refused) = (0, BTreeMap::new());
    for s in &sessions {
        let got = t.a.read(&t.a.queue(s), 1, Duration::from_secs(60)).await;
        assert_eq!(got.len(), 1, "every turn gets exactly one answer");
        match got[0].headers["x-aptix-outcome"].as_str() {
            "final" => finals += 1,
            _ => *refused.entry(codes(&got[0]).join(",")).or_default() += 1,
        }
    }
    (finals, refused)
}

#[tokio::test]
async fn limits_hold_across_workers_and_concurrent_publishers() {
    let limits = TenantLimits { turns_in_flight: 2, ..Default::default() };
    let t = start(3, limits).await;
    t.h.sim.set_latency(Latency { fixed_ms: 300, ..Default::default() });
    let (finals, refused) = flood(&t, 4, 16).await;
    assert!(finals >= 2, "{finals} {refused:?}");
    assert_eq!(refused.keys().collect::<Vec<_>>(), ["limit.turns_in_flight"], "{refused:?}");
    assert!(peak(&t.h, "created_at").await <= 2, "never more than 2 in flight");
    stop(t).await;
}

#[tokio::test]
async fn turns_over_the_limit_are_held_and_all_complete() {
    let limits =
        TenantLimits { turns_in_flight: 2, over_limit: OverLimit::Queue, ..Default::default() };
    let t = start(3, limits).await;
    t.h.sim.set_latency(Latency { fixed_ms: 200, ..Default::default() });
    let (finals, refused) = flood(&t, 4, 12).await;
    assert_eq!((finals, refused.len()), (12, 0), "{refused:?}");
    assert!(peak(&t.h, "started_at").await <= 2, "never more than 2 started at once");
    stop(t).await;
}

#[tokio::test]
async fn per_minute_limits_count_exactly() {
    let limits = TenantLimits { turns_per_minute: 5, sessions_per_minute: 3, ..Default::default() };
    let t = start(2, limits).await;
    let (finals, refused) = flood(&t, 3, 3).await;
    assert_eq!((finals, refused.len()), (3, 0), "{refused:?}");
    // Two more sessions: over sessions_per_minute, and nothing of them is kept.
    let (finals, refused) = flood(&t, 2, 2).await;
    let expect: BTreeMap<String, usize> = [("limit.sessions_per_minute".to_owned(), 2)].into();
    assert_eq!((finals, refused), (0, expect));
    // Four more turns in a session that exists: two fit in turns_per_minute.
    let s: String = sqlx::query_scalar("SELECT id::text FROM sessions LIMIT 1")
        .fetch_one(t.h.deps.store.pool())
        .await
        .unwrap();
    for n in 2..6 {
        t.a.submit(&user_turn(&s, &format!("t{n}"), "once more")).await;
    }
    let got = t.a.read(&t.a.queue(&s), 4, Duration::from_secs(30)).await;
    let outcomes: Vec<String> =
        got.iter().map(|r| codes(r).first().cloned().unwrap_or_else(|| "ok".into())).collect();
    assert_eq!(outcomes.iter().filter(|c| *c == "ok").count(), 2, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|c| *c == "limit.turns_per_minute").count(), 2);
    stop(t).await;
}

/// A message given up (poison, retries spent) fails the turn it admitted: never a turn of
/// another tenant's session, however exactly the copy matches it (docs/tenancy.md §4).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_given_up_copy_cannot_fail_another_tenants_turn() {
    use aptix::broker::{process_one, Delivery, StageName};
    let t = start(0, TenantLimits::default()).await;
    let s = new_session();
    let turn = user_turn(&s, "t1", "mine");
    t.a.submit(&turn).await;
    let validate = StageName::new("validate");
    let handler = aptix::pipeline::handler(&t.h.deps, validate).unwrap();
    let settings = aptix::pipeline::runtime_settings(&t.h.settings, validate);
    assert!(process_one(validate, &*handler, &t.h.conn, &t.h.publisher, &settings).await.unwrap());
    let state = || {
        sqlx::query_scalar::<_, String>("SELECT state FROM turns WHERE session_id = $1::uuid")
            .bind(s.clone())
            .fetch_one(t.h.deps.store.pool())
    };
    assert_eq!(state().await.unwrap(), "running");
    let copy = |user: &str| Delivery {
        body: serde_json::to_vec(&turn).unwrap().into(),
        headers: Default::default(),
        message_id: Some("copy".into()),
        reply_to: None,
        user_id: Some(user.to_owned()),
        kind: None,
        redelivered: true,
        attempt: 0,
        hint: Default::default(),
    };
    handler.exhausted(copy(&t.b.user), "poison: test".into()).await;
    assert_eq!(state().await.unwrap(), "running", "b's copy leaves a's turn alone");
    handler.exhausted(copy(&t.a.user), "poison: test".into()).await;
    assert_eq!(state().await.unwrap(), "failed", "a's own copy fails it");
    drop(handler);
    stop(t).await;
}

/// Held turns reserve their own requests too (docs/tenancy.md §7): with `tokens_per_minute`
/// below one turn's estimate, a second large turn stays held while the first runs (it started
/// on the 1,000-token reservation before).
#[tokio::test]
async fn held_turns_reserve_their_own_requests() {
    let limits = TenantLimits {
        tokens_per_minute: 20_000,
        over_limit: OverLimit::Queue,
        ..Default::default()
    };
    let t = start(1, limits).await;
    t.h.sim.set_latency(Latency { fixed_ms: 3_000, ..Default::default() });
    let large = "x".repeat(100_000); // about 25,000 tokens by its size
    let (first, second) = (new_session(), new_session());
    t.a.submit(&user_turn(&first, "t1", &large)).await;
    t.a.submit(&user_turn(&second, "t1", &large)).await;
    let count =
        |sql: &'static str| sqlx::query_scalar::<_, i64>(sql).fetch_one(t.h.deps.store.pool());
    let deadline = tokio::time::Instant::now() + WAIT;
    while count("SELECT count(*) FROM turns").await.unwrap() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "both turns admitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let estimates = count("SELECT min(token_estimate) FROM turns").await.unwrap();
    assert!(estimates > 20_000, "{estimates}");
    tokio::time::sleep(Duration::from_millis(500)).await; // the first turn's call takes 3 s
    let started = count("SELECT count(*) FROM turns WHERE started_at IS NOT NULL").await.unwrap();
    assert_eq!(started, 1, "one large turn in flight at a time");
    stop(t).await;
}

/// Waits until a turn of tenant A runs; fails with what `session`'s queue got if none does.
async fn until_running(t: &Two, session: &str) {
    let running = "SELECT count(*) FROM turns WHERE state = 'running'";
    let deadline = tokio::time::Instant::now() + WAIT;
    while sqlx::query_scalar::<_, i64>(running).fetch_one(t.h.deps.store.pool()).await.unwrap() == 0
    {
        if tokio::time::Instant::now() > deadline {
            let got = t.a.read(&t.a.queue(session), 1, Duration::from_secs(1)).await;
            panic!("the turn never ran: {:?}", got.first().map(|r| &r.body));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits a turn of tenant A in `session` (while another runs) and checks it gets its answer,
/// not a refusal.
async fn second_turn_runs(t: &Two, session: &str) {
    t.a.submit(&user_turn(session, "t1", "and now?")).await;
    let got = t.a.read(&t.a.queue(session), 1, WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
}

/// An image counts 1,000 tokens in a turn's estimate, not its base64's length / 4: a turn
/// carrying a 300 KB screenshot (100,000 "tokens" of base64) does not refuse the tenant's next
/// turn while it runs.
#[tokio::test]
async fn an_image_counts_as_an_image_not_as_its_base64() {
    use base64::Engine as _;
    let t = start(1, TenantLimits { tokens_per_minute: 50_000, ..Default::default() }).await;
    t.h.sim.set_latency(Latency { fixed_ms: 3_000, ..Default::default() });
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.resize(300_000, 7);
    let data = base64::engine::general_purpose::STANDARD.encode(&png);
    let (first, second) = (new_session(), new_session());
    let mut turn = user_turn(&first, "t1", "what is on the screen?");
    turn["ClipboardImages"] =
        json!([{ "Id": "shot", "MimeType": "image/png", "DataBase64": data }]);
    t.a.submit(&turn).await;
    until_running(&t, &first).await;
    let estimate: i64 = sqlx::query_scalar("SELECT token_estimate FROM turns")
        .fetch_one(t.h.deps.store.pool())
        .await
        .unwrap();
    assert!(estimate < 2_000, "{estimate}");
    second_turn_runs(&t, &second).await;
    stop(t).await;
}

/// A reservation counts the tenant's largest round trip of the last two minutes only
/// (docs/tenancy.md §7): one from an hour ago, not yet pruned (rows go when the tenant is next
/// charged), does not refuse a turn admitted while another runs.
#[tokio::test]
async fn an_old_round_trip_reserves_nothing() {
    let t = start(1, TenantLimits { tokens_per_minute: 50_000, ..Default::default() }).await;
    let old = "INSERT INTO tenant_tokens (tenant, tokens, at)
               VALUES ('ta', 1000000, now() - interval '1 hour')";
    sqlx::query(old).execute(t.h.deps.store.pool()).await.unwrap();
    t.h.sim.set_latency(Latency { fixed_ms: 3_000, ..Default::default() });
    let (first, second) = (new_session(), new_session());
    t.a.submit(&user_turn(&first, "t1", "first")).await;
    until_running(&t, &first).await;
    second_turn_runs(&t, &second).await;
    stop(t).await;
}

/// Tokens are charged from each record's usage; once the last minute's total reaches the limit,
/// the next turn is refused.
#[tokio::test]
async fn the_token_budget_is_charged_from_usage() {
    let t = start(1, TenantLimits { tokens_per_minute: 1, ..Default::default() }).await;
    let s = new_session();
    t.a.submit(&user_turn(&s, "t1", "spend")).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(got[0].headers["x-aptix-outcome"], "final", "{}", got[0].body);
    let used = got[0].body["Result"]["Usage"]["TotalTokens"].as_i64().unwrap();
    let charged: i64 = sqlx::query_scalar("SELECT sum(tokens)::bigint FROM tenant_tokens")
        .fetch_one(t.h.deps.store.pool())
        .await
        .unwrap();
    assert_eq!(charged, used);
    t.a.submit(&user_turn(&s, "t2", "again")).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(codes(&got[0]), ["limit.tokens_per_minute"]);
    stop(t).await;
}

/// A call the provider answered with a refusal was billed: its usage is charged like an
/// answer's, so a tenant whose every call is refused still reaches `tokens_per_minute`.
#[tokio::test]
async fn a_refused_answer_is_charged_too() {
    let t = start(1, TenantLimits { tokens_per_minute: 1, ..Default::default() }).await;
    let s = new_session();
    t.a.submit(&user_turn(&s, "t1", "@refuse")).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(codes(&got[0]), ["llm.refused"], "{}", got[0].body);
    let charged: Option<i64> = sqlx::query_scalar("SELECT sum(tokens)::bigint FROM tenant_tokens")
        .fetch_one(t.h.deps.store.pool())
        .await
        .unwrap();
    assert!(charged.is_some_and(|n| n > 0), "the refusal's usage was not charged: {charged:?}");
    t.a.submit(&user_turn(&s, "t2", "again")).await;
    let got = t.a.read(&t.a.queue(&s), 1, WAIT).await;
    assert_eq!(codes(&got[0]), ["limit.tokens_per_minute"]);
    stop(t).await;
}
