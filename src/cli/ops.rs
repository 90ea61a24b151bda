//! Operator and backend commands over the running system: `migrate`, `submit` and
//! `session show`.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::broker::client::SessionClient;
use crate::config::Settings;
use crate::contracts::{headers, SessionId, TenantName};
use crate::pipeline;
use crate::store::Store;
use crate::worker::block_on;
use anyhow::Context as _;

/// `aptix migrate`: create the database if needed and apply migrations.
pub fn migrate(settings: Settings) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let url = settings.database.url.expose();
        Store::create_database(url)
            .await
            .with_context(|| format!("creating the database at {}", settings.database.url))?;
        Store::connect(url, 1)?.migrate().await.context("applying migrations")?;
        println!("database {} is migrated", settings.database.url);
        Ok(ExitCode::SUCCESS)
    })
}

/// `aptix session show ID`: the session, its turns and records as JSON.
pub fn session_show(settings: Settings, id: &str) -> anyhow::Result<ExitCode> {
    let session: SessionId = id.parse().map_err(|(_, m): (_, String)| anyhow::anyhow!(m))?;
    block_on(async move {
        let store = Store::connect(settings.database.url.expose(), 1)?;
        match store.session_view(&session).await? {
            Some(view) => {
                println!("{}", serde_json::to_string_pretty(&view)?);
                Ok(ExitCode::SUCCESS)
            }
            None => {
                eprintln!("no session {session}");
                Ok(ExitCode::from(1))
            }
        }
    })
}

/// `aptix session rename ID NAME`: exit 0 renamed, 1 no such session, 2 a bad name.
pub fn session_rename(settings: Settings, id: &str, name: &str) -> anyhow::Result<ExitCode> {
    let session: SessionId = id.parse().map_err(|(_, m): (_, String)| anyhow::anyhow!(m))?;
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 80 || name.chars().any(char::is_control) {
        eprintln!("a session name is 1-80 characters without control characters");
        return Ok(ExitCode::from(2));
    }
    block_on(async move {
        let store = Store::connect(settings.database.url.expose(), 1)?;
        if store.rename_session(&session, name).await? {
            println!("session {session} is now called {name:?}");
            Ok(ExitCode::SUCCESS)
        } else {
            eprintln!("no session {session}");
            Ok(ExitCode::from(1))
        }
    })
}

/// `aptix submit FILE [--wait] [--timeout SECS]`: publish a request; with `--wait`, print each
/// message of that turn as one JSON line until the reply that answers this submission (see
/// `verdict`). Exit 0 on success, 1 on an error reply, 2 on timeout.
pub fn submit(
    settings: Settings,
    file: &Path,
    wait: bool,
    timeout: Duration,
    tenant: Option<TenantName>,
) -> anyhow::Result<ExitCode> {
    let body = super::read_input(file).with_context(|| format!("reading {}", file.display()))?;
    let (session, turn) = crate::rules::turn_hint(&body);
    block_on(async move {
        let topology = pipeline::topology(&settings);
        let url = settings.amqp.url.expose();
        let connected = match tenant {
            Some(t) => SessionClient::connect_as(url, topology, t).await,
            None => SessionClient::connect(url, topology).await,
        };
        let client = connected.with_context(|| {
                format!(
                    "connecting to RabbitMQ at {} (is it running? `docker compose up -d rabbitmq postgres`)",
                    settings.amqp.url
                )
            })?;
        let waiting = match (wait, session) {
            (true, Some(s)) => Some(s),
            (true, None) => anyhow::bail!("--wait needs a request with a valid SessionId"),
            (false, _) => None,
        };
        if let Some(s) = &waiting {
            // Declared before publishing so no reply can arrive before its queue exists.
            client.open_session(s).await?;
        }
        let id = format!("submit:{}", uuid::Uuid::new_v4());
        let submission = Submission::new(id.clone(), turn, &body);
        let key = session.map_or_else(|| "-".to_owned(), |s| s.to_string());
        client.submit(&key, id, body).await?;
        let Some(session) = waiting else {
            eprintln!("published to exchange {}", client.requests_exchange());
            return Ok(ExitCode::SUCCESS);
        };
        match tokio::time::timeout(timeout, follow(&client, &session, &submission)).await {
            Ok(result) => result,
            Err(_) => {
                eprintln!("no reply to the submission within {} s", timeout.as_secs());
                Ok(ExitCode::from(2))
            }
        }
    })
}

async fn follow(
    client: &SessionClient,
    session: &SessionId,
    submission: &Submission,
) -> anyhow::Result<ExitCode> {
    // What is not ours (other turns, other submissions' refusals, stale replies) is left unacked
    // and goes back to the queue when we disconnect.
    let mut replies = client.replies(session, 256).await?;
    let mut floor = None;
    let mut seen = HashSet::new();
    while let Some(message) = replies.next().await {
        let message = message?;
        if message.message_id.as_ref().is_some_and(|id| !seen.insert(id.clone())) {
            // A copy of a message already read (client protocol §11): that one is printed or
            // still unacked, so this copy can go.
            message.ack().await?;
            continue;
        }
        match verdict(
            submission,
            floor,
            &message.headers,
            message.correlation_id.as_deref(),
            &message.body,
        ) {
            Verdict::Skip => {}
            Verdict::Continued(step) => floor = floor.max(Some(step)),
            Verdict::Progress => {
                println!("{}", String::from_utf8_lossy(&message.body));
                message.ack().await?;
            }
            Verdict::Answer => {
                println!("{}", String::from_utf8_lossy(&message.body));
                message.ack().await?;
                let reply: serde_json::Value =
                    serde_json::from_slice(&message.body).unwrap_or_default();
                let ok = reply.get("Successful").and_then(serde_json::Value::as_bool) == Some(true);
                return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) });
            }
        }
    }
    anyhow::bail!("the reply queue consumer stopped")
}

/// The submission `submit --wait` waits for an answer to.
#[derive(Debug)]
struct Submission {
    /// Its `message_id`.
    message_id: String,
    /// Its `TurnId`, when it names a valid one.
    turn: Option<String>,
    /// For a Tool Continuation Submission, the `ToolCallId`s of its `ToolResults`.
    results: Option<Vec<String>>,
}

impl Submission {
    fn new(message_id: String, turn: Option<String>, body: &[u8]) -> Submission {
        let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let results = request.get("ToolResults").and_then(serde_json::Value::as_array).map(|rs| {
            rs.iter()
                .filter_map(|r| r.get("ToolCallId").and_then(serde_json::Value::as_str))
                .map(str::to_owned)
                .collect::<Vec<String>>()
        });
        Submission { message_id, turn, results }
    }
}

/// What [`follow`] does with one reply-queue message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The answer to the submission: print it, acknowledge it, stop.
    Answer,
    /// A delta of the turn that may lead to the answer: print it, acknowledge it, read on.
    Progress,
    /// The `client_tool_continuation` of the step this submission continues (its step): the
    /// question, not the answer. Left unacked; replies of the turn up to that step are stale.
    Continued(i64),
    /// Not for this submission, or stale: left unacked for whoever it is for.
    Skip,
}

/// Whether a reply-queue message (its headers, `correlation_id` and body) answers `submission`,
/// given `floor`, the highest [`Verdict::Continued`] step seen so far. The rule (client protocol
/// §4 step 5, §7, §8):
///
/// - A message with a `correlation_id` answers the submission it names: a refusal (or a
///   `resent-` copy of a finished turn's reply) with ours is the answer, whatever its turn; one
///   with another id answers someone else and is skipped. So a refused submission never waits.
/// - Otherwise only messages of the submission's turn with an `x-aptix-step` count (without a
///   valid `TurnId` only a refusal can answer), and those of a step up to `floor` are stale.
/// - A delta of a later step is progress towards the answer, printed but not the answer.
/// - A user turn is answered by the turn's first reply (any outcome).
/// - A Tool Continuation Submission is answered by the reply of the step after the one it
///   continues. Which step that is the client does not know, so the continued step is told by
///   its reply: a `client_tool_continuation` whose `ToolCalls` include a `ToolCallId` of our
///   `ToolResults` is the question these results answer (a stale copy, e.g. redelivered after
///   another consumer exited without its ack): it sets `floor`. Any other reply of a later step
///   (a further `client_tool_continuation` asks for new calls, or `final`, or `failed` such as a
///   `turn.cancelled`) is the answer.
fn verdict(
    submission: &Submission,
    floor: Option<i64>,
    headers: &BTreeMap<String, String>,
    correlation_id: Option<&str>,
    body: &[u8],
) -> Verdict {
    if let Some(correlation_id) = correlation_id {
        return if correlation_id == submission.message_id {
            Verdict::Answer
        } else {
            Verdict::Skip
        };
    }
    let header = |key: &str| headers.get(key).map(String::as_str);
    if submission.turn.is_none() || header(headers::TURN_ID) != submission.turn.as_deref() {
        return Verdict::Skip;
    }
    let Some(step) = header(headers::STEP).and_then(|s| s.parse::<i64>().ok()) else {
        return Verdict::Skip;
    };
    if floor.is_some_and(|floor| step <= floor) {
        return Verdict::Skip;
    }
    match header(headers::KIND) {
        Some("delta") => Verdict::Progress,
        Some("reply") => match &submission.results {
            Some(results)
                if header(headers::OUTCOME) == Some("client_tool_continuation")
                    && asks_for(body, results) =>
            {
                Verdict::Continued(step)
            }
            _ => Verdict::Answer,
        },
        _ => Verdict::Skip,
    }
}

/// Whether a `client_tool_continuation` reply's `ToolCalls` include one of `results`' ids.
fn asks_for(body: &[u8], results: &[String]) -> bool {
    let reply: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    reply["Result"]["ToolCalls"].as_array().is_some_and(|calls| {
        calls.iter().any(|call| {
            call["ToolCallId"].as_str().is_some_and(|id| results.iter().any(|r| r.as_str() == id))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FINAL: &[u8] = br#"{"Successful":true,"Result":{"Kind":"final"}}"#;
    const CANCELLED: &[u8] = br#"{"Successful":false,"Errors":[{"Code":"turn.cancelled"}]}"#;
    const REFUSED: &[u8] = br#"{"Successful":false,"Errors":[{"Code":"turn.not_found"}]}"#;
    const DELTA: &[u8] = br#"{"Delta":true,"TurnId":"t1","Step":3,"Seq":0}"#;
    const USER_TURN: &[u8] = br#"{"TurnId":"t1","Instruction":"hi"}"#;

    /// A `client_tool_continuation` body asking for `call`.
    fn asks(call: &str) -> Vec<u8> {
        let calls = json!([{"ToolCallId": call, "Name": "read_file", "ArgumentsJson": "{}"}]);
        let result = json!({"Kind": "client_tool_continuation", "ToolCalls": calls});
        json!({"Successful": true, "Result": result}).to_string().into_bytes()
    }

    /// Results for `call_1`, which step 2 of turn `t1` asked for.
    fn continuation() -> Submission {
        let results = json!([{"ToolCallId": "call_1", "ExecutionMs": 4, "ResultJson": "{}"}]);
        let body = json!({"TurnId": "t1", "ToolResults": results}).to_string();
        Submission::new("submit:m2".to_owned(), Some("t1".to_owned()), body.as_bytes())
    }

    fn user_turn() -> Submission {
        Submission::new("submit:m1".to_owned(), Some("t1".to_owned()), USER_TURN)
    }

    fn headers(
        turn: &str,
        kind: &str,
        step: Option<i64>,
        outcome: Option<&str>,
    ) -> BTreeMap<String, String> {
        let mut h = BTreeMap::new();
        h.insert(headers::TURN_ID.to_owned(), turn.to_owned());
        h.insert(headers::KIND.to_owned(), kind.to_owned());
        if let Some(step) = step {
            h.insert(headers::STEP.to_owned(), step.to_string());
        }
        if let Some(outcome) = outcome {
            h.insert(headers::OUTCOME.to_owned(), outcome.to_owned());
        }
        h
    }

    fn step_reply(step: i64, outcome: &str) -> BTreeMap<String, String> {
        headers("t1", "reply", Some(step), Some(outcome))
    }

    fn refusal() -> BTreeMap<String, String> {
        headers("t1", "reply", None, Some("refused"))
    }

    #[test]
    fn a_continuation_knows_its_tool_call_ids() {
        assert_eq!(continuation().results, Some(vec!["call_1".to_owned()]));
        assert_eq!(user_turn().results, None);
    }

    #[test]
    fn the_stale_continued_step_is_skipped_and_the_next_step_accepted() {
        let s = continuation();
        let stale = step_reply(2, "client_tool_continuation");
        // The issue's case: step 2's question, redelivered, comes first; it is not the answer.
        assert_eq!(verdict(&s, None, &stale, None, &asks("call_1")), Verdict::Continued(2));
        // Once its step is known, that step and earlier ones are stale.
        assert_eq!(verdict(&s, Some(2), &stale, None, &asks("call_1")), Verdict::Skip);
        let earlier = step_reply(1, "client_tool_continuation");
        assert_eq!(verdict(&s, Some(2), &earlier, None, &asks("call_2")), Verdict::Skip);
        assert_eq!(verdict(&s, Some(2), &step_reply(2, "failed"), None, CANCELLED), Verdict::Skip);
        // The step after it answers: completed, cancelled, or asking for more calls.
        assert_eq!(verdict(&s, Some(2), &step_reply(3, "final"), None, FINAL), Verdict::Answer);
        let cancelled = step_reply(3, "failed");
        assert_eq!(verdict(&s, Some(2), &cancelled, None, CANCELLED), Verdict::Answer);
        let more = step_reply(3, "client_tool_continuation");
        assert_eq!(verdict(&s, Some(2), &more, None, &asks("call_2")), Verdict::Answer);
    }

    #[test]
    fn without_a_stale_copy_the_next_step_is_the_answer() {
        let s = continuation();
        let more = step_reply(3, "client_tool_continuation");
        assert_eq!(verdict(&s, None, &more, None, &asks("call_2")), Verdict::Answer);
        assert_eq!(verdict(&s, None, &step_reply(3, "final"), None, FINAL), Verdict::Answer);
    }

    #[test]
    fn a_refusal_with_our_correlation_id_is_the_answer() {
        let s = continuation();
        assert_eq!(verdict(&s, None, &refusal(), Some("submit:m2"), REFUSED), Verdict::Answer);
        assert_eq!(verdict(&s, Some(2), &refusal(), Some("submit:m2"), REFUSED), Verdict::Answer);
        // A request without a valid TurnId can only be refused, under turn `-`.
        let no_turn = Submission::new("submit:m3".to_owned(), None, b"{}");
        let refused = headers("-", "reply", None, Some("refused"));
        assert_eq!(verdict(&no_turn, None, &refused, Some("submit:m3"), REFUSED), Verdict::Answer);
        assert_eq!(verdict(&no_turn, None, &refused, Some("submit:m1"), REFUSED), Verdict::Skip);
    }

    #[test]
    fn a_refusal_or_resent_reply_for_another_submission_is_skipped() {
        let s = continuation();
        assert_eq!(verdict(&s, None, &refusal(), Some("submit:m1"), REFUSED), Verdict::Skip);
        assert_eq!(verdict(&s, None, &refusal(), None, REFUSED), Verdict::Skip);
        // `resent-`: a finished turn's final reply, sent again for someone else's duplicate.
        let resent = step_reply(3, "final");
        assert_eq!(verdict(&s, Some(2), &resent, Some("submit:m1"), FINAL), Verdict::Skip);
        assert_eq!(verdict(&user_turn(), None, &resent, Some("submit:m9"), FINAL), Verdict::Skip);
    }

    #[test]
    fn deltas_are_never_the_answer() {
        let s = continuation();
        let delta = headers("t1", "delta", Some(3), None);
        assert_eq!(verdict(&s, Some(2), &delta, None, DELTA), Verdict::Progress);
        assert_eq!(verdict(&s, None, &delta, None, DELTA), Verdict::Progress);
        let stale = headers("t1", "delta", Some(2), None);
        assert_eq!(verdict(&s, Some(2), &stale, None, DELTA), Verdict::Skip);
        let other = headers("t0", "delta", Some(3), None);
        assert_eq!(verdict(&s, Some(2), &other, None, DELTA), Verdict::Skip);
    }

    #[test]
    fn a_user_turn_takes_its_first_reply_and_skips_other_turns() {
        let s = user_turn();
        let question = step_reply(0, "client_tool_continuation");
        assert_eq!(verdict(&s, None, &question, None, &asks("call_1")), Verdict::Answer);
        assert_eq!(verdict(&s, None, &step_reply(1, "final"), None, FINAL), Verdict::Answer);
        let other = headers("t0", "reply", Some(0), Some("final"));
        assert_eq!(verdict(&s, None, &other, None, FINAL), Verdict::Skip);
    }
}
