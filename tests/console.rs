//! `aptix console` against a live pipeline: a session produced by the pipeline is found,
//! followed to its turn's timeline and payloads; the queues page lists a dead letter; every page
//! needs a sign-in, a tenant's operator sees only its sessions, actions need the admin token;
//! and, in headless Chromium (clients/console-browser), an operator
//! replays the dead letter through the page and its turn completes.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{new_session, user_turn, Harness};
use serde_json::{json, Value};

const TOKEN: &str = "console-test-token";
const VIEWER: &str = "console-viewer-token";
const TENANT: &str = "console-acme-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_follows_a_turn_and_replays_a_dead_letter_in_the_browser() {
    let h = Harness::start(1).await;
    let done = new_session();
    h.submit(&user_turn(&done, "t1", "how is the invoice e-mail sent")).await;
    assert_eq!(h.replies(&done, 1, Duration::from_secs(60)).await.len(), 1);
    let (stuck, dead_id) = dead_lettered_request(&h).await;

    // RabbitMQ's management API gives the queues page its rates and workers (setup.sh enables it).
    let management = std::net::TcpStream::connect("127.0.0.1:15672").is_ok();
    assert!(management || std::env::var("APTIX_REQUIRE_MANAGEMENT").is_err(), "no management API");
    let (mut admin, base) = console(&h, Some(TOKEN), management).await;
    let http = aptix::http::client().build().unwrap();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move {
            let r = http.get(url).basic_auth("admin", Some(TOKEN)).send().await.unwrap();
            assert_eq!(r.status(), 200);
            assert!(r.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("default-src 'none'"));
            assert_eq!(r.headers()["cache-control"], "no-store");
            r.text().await.unwrap()
        }
    };
    let found = get(format!("/sessions?q={done}")).await;
    assert!(found.contains(&format!("/sessions/{done}")) && !found.contains(&stuck), "{found}");
    let session = get(format!("/sessions/{done}")).await;
    assert!(session.contains(&format!("/sessions/{done}/turns/t1")), "{session}");
    // Duplicates of the finished turn are each sent its reply again, kept by reference: the
    // session page names them and does not fill each in with the turn's whole answer.
    for _ in 0..2 {
        h.submit(&user_turn(&done, "t1", "how is the invoice e-mail sent")).await;
    }
    assert_eq!(h.replies(&done, 2, Duration::from_secs(60)).await.len(), 2);
    let session = get(format!("/sessions/{done}")).await;
    assert_eq!(session.matches("sent again").count(), 2, "{session}");
    assert!(!session.contains("PrimaryOutputText"), "a resent reply filled in: {session}");
    let turn = get(format!("/sessions/{done}/turns/t1")).await;
    for needle in [
        "Timeline",
        "admitted",
        "step 0 recorded",
        "step 0: retrieve",
        "step 0: invoke",
        "waited",
        "handled in",
        "[CONTEXT] block",
        "billing/invoice.rs",
        "how is the invoice e-mail sent",
    ] {
        assert!(turn.contains(needle), "missing {needle}");
    }
    assert!(turn.contains("<svg class=\"waterfall\""), "the turn's waterfall is drawn");
    reprocessed_many_times(&h, &done).await;
    let turn = get(format!("/sessions/{done}/turns/t1")).await;
    let live = h.records(&done).await.into_iter().find(|r| r["reprocess_of"].is_null()).unwrap();
    let live = format!(">record {}", live["id"].as_str().unwrap());
    assert!(turn.contains(&live), "the live record is shown");
    let shown = turn.matches("replayed by run").count() as i64;
    assert_eq!(shown, aptix::store::CONSOLE_ROWS - 1, "reprocessed records shown");
    // Spend of two tenants on two days (rows as the invoke stage reserves and persist settles
    // them): the admin's chart stacks both, a tenant's operator sees its own only.
    let today = spend_rows(&h).await;
    let eval_run = eval_report(&h).await;
    let evals = get(format!("/evals/{eval_run}")).await;
    assert!(evals.contains("<svg class=\"arms\"") && evals.contains("mini: 0.5000"), "{evals}");
    let budgets = get("/budgets".into()).await;
    for needle in [format!("acme on {today}: $0.250000"), format!("other on {today}: $1.000000")] {
        assert!(budgets.contains(&needle), "missing {needle}: {budgets}");
    }
    let queues = get("/queues".into()).await;
    assert!(queues.contains(&format!("dead-{dead_id}")) && queues.contains("turns"), "{queues}");
    if management {
        // The management API refreshes consumer details every few seconds (its stats interval).
        let mut page = queues.clone();
        for _ in 0..100 {
            if page.contains("aptix invoke worker on") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            page = get("/queues".into()).await;
        }
        assert!(page.contains("aptix invoke worker on"), "{page}");
        // Rate cells exist only with the API's answer, and each holds a number.
        let rates: Vec<&str> =
            page.split("class=\"rate\">").skip(1).map(|c| c.split('<').next().unwrap()).collect();
        assert!(!rates.is_empty() && rates.iter().all(|r| r.parse::<f64>().is_ok()), "{rates:?}");
    }

    // Every page but /healthz needs a sign-in; a wrong token signs in nobody.
    for (user, password) in [(None, None), (Some("admin"), Some("wrong"))] {
        let mut r = http.get(format!("{base}/sessions"));
        if let Some(user) = user {
            r = r.basic_auth(user, password);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert!(r.headers()["www-authenticate"].to_str().unwrap().starts_with("Basic"));
    }
    assert_eq!(aptix::http::get(format!("{base}/healthz")).await.unwrap().status(), 200);
    // Another site's page cannot have the operator's browser read the console (an image, a
    // fetch); a link from elsewhere to a page still opens it. The address never makes the
    // console say something.
    let from_elsewhere = |path: &str, mode: &str, dest: &str| {
        http.get(format!("{base}{path}"))
            .basic_auth("admin", Some(TOKEN))
            .header("sec-fetch-site", "cross-site")
            .header("sec-fetch-mode", mode)
            .header("sec-fetch-dest", dest)
    };
    let embedded = from_elsewhere("/queues", "no-cors", "image").send().await.unwrap();
    assert_eq!(embedded.status(), 403);
    let linked = from_elsewhere("/sessions", "navigate", "document").send().await.unwrap();
    assert_eq!(linked.status(), 200);
    let spoofed = get("/queues?notice=your+token+expired".into()).await;
    assert!(!spoofed.contains("token expired"), "{spoofed}");
    let unknown = get("/queues?action=987654321".into()).await;
    assert!(unknown.contains("no recorded action 987654321"), "{unknown}");
    // Without the right token nothing happens; a console without a token acts for nobody.
    let refused = http
        .post(format!("{base}/dead/replay"))
        .basic_auth("admin", Some(TOKEN))
        .form(&[("id", dead_id.as_str()), ("token", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let (mut readonly, ro_base) = console(&h, None, false).await;
    let ro = http
        .post(format!("{ro_base}/dead/replay"))
        .basic_auth("viewer", Some(VIEWER))
        .form(&[("id", dead_id.as_str()), ("token", TOKEN)]);
    assert_eq!(ro.send().await.unwrap().status(), 403);
    let as_viewer =
        |path: &str| http.get(format!("{ro_base}{path}")).basic_auth("viewer", Some(VIEWER));
    let ro_queues = as_viewer("/queues").send().await.unwrap().text().await.unwrap();
    assert!(ro_queues.contains("rates and workers need amqp.management_url"), "{ro_queues}");
    // An operator scoped to a tenant sees nothing of the others: the session (no tenant's) is
    // not listed, its pages are missing, and the pages about every tenant are not shown.
    let as_tenant =
        |path: String| http.get(format!("{ro_base}{path}")).basic_auth("acme", Some(TENANT));
    let listed = as_tenant(format!("/sessions?q={done}")).send().await.unwrap();
    assert_eq!(listed.status(), 200);
    assert!(!listed.text().await.unwrap().contains(&format!("/sessions/{done}")));
    for path in [
        format!("/sessions/{done}"),
        format!("/sessions/{done}/turns/t1"),
        "/queues".into(),
        "/actions".into(),
        "/evals".into(),
    ] {
        assert_eq!(as_tenant(path.clone()).send().await.unwrap().status(), 404, "{path}");
    }
    let own = as_tenant("/budgets".into()).send().await.unwrap().text().await.unwrap();
    assert!(own.contains("acme on ") && !own.contains("other on "), "{own}");
    let wrong = http.get(format!("{ro_base}/sessions")).basic_auth("acme", Some(VIEWER));
    assert_eq!(wrong.send().await.unwrap().status(), 401, "a token signs in its own user only");
    stop(&mut readonly);

    match browser() {
        Some(script) => {
            let seen = replay_in_browser(&script, &base, &done, &dead_id);
            assert_eq!(seen["sessions"]["listed"], true, "{seen}");
            assert!(seen["turn"]["timeline"].as_u64().unwrap() >= 3, "{seen}");
            assert_eq!(seen["turn"]["context"], true, "{seen}");
            assert!(seen["turn"]["waterfall_bars"].as_u64().unwrap() >= 4, "{seen}");
            assert!(seen["turn"]["waterfall_height"].as_f64().unwrap() > 40.0, "{seen}");
            assert_eq!(seen["budgets"]["bars"].as_array().unwrap().len(), 3, "{seen}");
            let legend = seen["budgets"]["legend"].to_string();
            assert!(legend.contains("\"acme\"") && legend.contains("\"other\""), "{seen}");
            assert!(seen["budgets"]["width"].as_f64().unwrap() > 400.0, "{seen}");
            assert_eq!(seen["eval"]["charts"], 1, "one chart per scorer: {seen}");
            assert_eq!(seen["eval"]["bars"].as_array().unwrap().len(), 2, "{seen}");
            assert_eq!(seen["queues"]["dead_listed"], true, "{seen}");
            assert_eq!(seen["after"]["notice"], format!("replayed {dead_id}"), "{seen}");
            // Answered by a redirect to a page read from the action's record: a refresh tells
            // the same and acts no more (one replay in the log).
            let url = seen["after"]["url"].as_str().unwrap();
            assert!(url.starts_with(&format!("{base}/queues?action=")), "{seen}");
            assert_eq!(seen["after"]["notice_on_reload"], seen["after"]["notice"], "{seen}");
            let replays = seen["actions"]["rows"].as_array().unwrap();
            let replays = replays.iter().filter(|r| r.to_string().contains("dead.replay"));
            assert_eq!(replays.count(), 1, "{seen}");
            assert_eq!(seen["after"]["still_listed"], false, "{seen}");
            let rows = seen["actions"]["rows"].to_string();
            assert!(rows.contains("console") && rows.contains("dead.replay"), "{seen}");
            // The replayed request is admitted and answered.
            let replies = h.replies(&stuck, 2, Duration::from_secs(60)).await;
            let last = replies.iter().rfind(|r| r.is_final).unwrap();
            assert_eq!(last.body["Successful"], true, "{}", last.body);
        }
        None => eprintln!("SKIPPED the browser half: no Chromium or no clients/console-browser/node_modules (set APTIX_REQUIRE_BROWSER=1 to fail instead)"),
    }
    stop(&mut admin);
    h.teardown().await;
}

/// Reprocessing runs add records to a turn without bound: `t1` of `session` gets more than the
/// console's page reads, each as a run of its own.
async fn reprocessed_many_times(h: &Harness, session: &str) {
    sqlx::query(
        "INSERT INTO response_records
         SELECT (jsonb_populate_record(r, jsonb_build_object(
                     'id', gen_random_uuid(), 'reprocess_of', r.id,
                     'reprocess_run', 'run-' || n, 'created_at', now()))).*
           FROM response_records r, generate_series(1, $2) n
          WHERE r.session_id = $1::uuid AND r.turn_id = 't1' AND r.reprocess_of IS NULL",
    )
    .bind(session)
    .bind(aptix::store::CONSOLE_ROWS + 20)
    .execute(h.deps.store.pool())
    .await
    .unwrap();
}

/// Settled spend rows: tenant `acme` $0.25 today, `other` $1 today and $0.5 yesterday. Returns
/// today's UTC date as the console writes it.
async fn spend_rows(h: &Harness) -> String {
    for (tenant, micros, days_ago) in
        [("acme", 250_000, 0), ("other", 1_000_000, 0), ("other", 500_000, 1)]
    {
        sqlx::query(
            "INSERT INTO spend (tenant, context, session_id, turn_id, step, reserved_micros,
                                cost_micros, at)
             VALUES ($1, 'default', gen_random_uuid(), 't', 0, $2, $2,
                     now() - make_interval(days => $3))",
        )
        .bind(tenant)
        .bind(micros)
        .bind(days_ago)
        .execute(h.deps.store.pool())
        .await
        .unwrap();
    }
    chrono::Utc::now().date_naive().to_string()
}

/// An evaluation's report as `aptix eval` keeps it: two arms, one scorer. Returns its run id.
async fn eval_report(h: &Harness) -> String {
    let estimate =
        |mean: f64, low: f64, high: f64| json!({"n": 2, "mean": mean, "low": low, "high": high});
    let arm = |name: &str, mean: f64, versus: Value| {
        json!({"name": name, "model": null, "conversation_context": null, "round_trips": 2,
               "turns_not_done": 0, "scores": {"exact": estimate(mean, mean - 0.5, mean + 0.5)},
               "versus_baseline": versus})
    };
    let paired = json!({"exact": {"difference": estimate(-0.5, -1.0, 0.0), "better": 0,
                                  "worse": 1, "p_value": 1.0}});
    let report = json!({"version": 1, "run": "ev-console", "baseline": "original", "primary": "exact",
                        "arms": [arm("original", 1.0, json!({})), arm("mini", 0.5, paired)],
                        "regressions": []});
    h.deps.store.save_eval("ev-console", &report).await.unwrap();
    "ev-console".into()
}

/// A request given up while the database could not admit it (`turns` renamed away meanwhile):
/// its session, and its dead letter's id.
async fn dead_lettered_request(h: &Harness) -> (String, String) {
    let pool = h.deps.store.pool();
    sqlx::query("ALTER TABLE turns RENAME TO turns_away").execute(pool).await.unwrap();
    let stuck = new_session();
    h.submit(&user_turn(&stuck, "t1", "hello")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let id = loop {
        let (_, out) = h.aptix(&["dead", "list", "--json"]);
        let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
        if let Some(l) = listed.first() {
            break l["id"].as_str().unwrap().to_owned();
        }
        assert!(tokio::time::Instant::now() < deadline, "no dead letter");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    sqlx::query("ALTER TABLE turns_away RENAME TO turns").execute(pool).await.unwrap();
    (stuck, id)
}

/// A console process, stopped when dropped (a failed assertion must not leave it running).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = common::terminate(&mut self.0);
    }
}

/// `aptix console` on a free port, with `token` as its admin token and RabbitMQ's management
/// API when `management`; waits until it answers.
async fn console(h: &Harness, token: Option<&str>, management: bool) -> (Running, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aptix"));
    // Port 0: the console binds a free port itself and prints where (a port the test chose and
    // released could be taken by another test's server first).
    cmd.args(["console", "--listen", "127.0.0.1:0"])
        .env_remove("APTIX_CONFIG")
        .envs(h.child_env())
        .stdout(Stdio::piped());
    if let Some(t) = token {
        cmd.env("APTIX__CONSOLE__ADMIN_TOKEN", t);
    }
    cmd.env("APTIX__CONSOLE__VIEWER_TOKEN", VIEWER)
        .env("APTIX__CONSOLE__TENANT_TOKENS__ACME", TENANT);
    if management {
        cmd.env("APTIX__AMQP__MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672");
    }
    let mut child = cmd.spawn().unwrap();
    let printed = printed_address(child.stdout.take().unwrap());
    let base = match tokio::time::timeout(Duration::from_secs(10), printed).await {
        Ok(Ok(line)) => {
            line.trim().trim_start_matches("console at ").trim_end_matches('/').to_owned()
        }
        other => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the console printed no address: {other:?}");
        }
    };
    for _ in 0..100 {
        if aptix::http::get(format!("{base}/healthz")).await.is_ok() {
            return (Running(child), base);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the console did not answer on {base}");
}

/// The console's first line (`console at http://…/`); the rest of its output is read and
/// dropped, so a later print never meets a closed pipe.
fn printed_address(out: std::process::ChildStdout) -> tokio::sync::oneshot::Receiver<String> {
    use std::io::BufRead as _;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(out);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    rx
}

fn stop(running: &mut Running) {
    assert!(common::terminate(&mut running.0).success());
}

/// The browser script, when Chromium and its Node packages are installed; a missing browser
/// fails the test when APTIX_REQUIRE_BROWSER=1 (as in .ci/run).
fn browser() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/console-browser");
    let chromium = std::env::var("APTIX_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let ready = dir.join("node_modules/puppeteer-core").exists()
        && std::path::Path::new(&chromium).exists();
    if !ready && std::env::var("APTIX_REQUIRE_BROWSER").as_deref() == Ok("1") {
        panic!(
            "APTIX_REQUIRE_BROWSER=1 but {chromium} or {}/node_modules is missing",
            dir.display()
        );
    }
    ready.then(|| dir.join("replay.mjs"))
}

fn replay_in_browser(script: &std::path::Path, base: &str, session: &str, dead: &str) -> Value {
    let mut cmd = Command::new("node");
    cmd.arg(script).args([base, session, "t1", dead, TOKEN]);
    if let Ok(dir) = std::env::var("APTIX_CONSOLE_SCREENSHOTS") {
        cmd.arg(dir);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.trim()).unwrap()
}
