//! The console's pages as HTML: one layout, plain tables and forms, no script. maud escapes
//! every value, so stored text (a request, a dead letter's body) is shown, never run.

use maud::{html, Markup, DOCTYPE};
use serde_json::Value;

use crate::broker::{DeadLetter, QueueState};
use crate::store::{OperatorAction, SessionSummary, SessionView, CONSOLE_ROWS};

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2430}\
nav a{margin-right:1rem}table{border-collapse:collapse;margin:.5rem 0}\
td,th{border:1px solid #ccd;padding:.25rem .5rem;text-align:left;vertical-align:top}\
pre{background:#f4f5f8;padding:.5rem;overflow:auto;max-height:30rem;white-space:pre-wrap}\
.notice{background:#e8f4e8;padding:.5rem}.note{color:#667}form.inline{display:inline}";

/// A page with the console's navigation.
pub fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " · Aptix console" }
                style { (STYLE) }
            }
            body {
                nav { a href="/sessions" { "Sessions" } a href="/queues" { "Queues" } a href="/actions" { "Actions" } a href="/budgets" { "Budgets" } a href="/evals" { "Evaluations" } }
                h1 { (title) }
                (body)
            }
        }
    }
}

/// A page that only says something.
pub fn message(title: &str, text: &str) -> Markup {
    layout(title, html! { p { (text) } })
}

/// A JSON value's text: strings bare, null as `-`.
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A JSON value, indented.
pub fn json_block(v: &Value) -> Markup {
    html! { pre { (serde_json::to_string_pretty(v).unwrap_or_default()) } }
}

/// The session search and its results.
pub fn sessions(q: &str, since: &str, until: &str, found: &[SessionSummary]) -> Markup {
    layout(
        "Sessions",
        html! {
            form method="get" action="/sessions" {
                input type="search" name="q" value=(q) placeholder="id, name or workspace";
                " created from " input name="since" value=(since) placeholder="2026-11-25T00:00:00Z";
                " to " input name="until" value=(until) placeholder="RFC 3339";
                " " button type="submit" { "Search" }
            }
            table {
                tr { th { "session" } th { "name" } th { "workspace" } th { "repo" } th { "turns" } th { "running" } th { "created (UTC)" } }
                @for s in found {
                    tr {
                        td { a href=(format!("/sessions/{}", s.id)) { (s.id) } }
                        td { (s.name.as_deref().unwrap_or("-")) }
                        td { (s.workspace_id.as_deref().unwrap_or("-")) }
                        td { (s.repo.as_deref().unwrap_or("-")) }
                        td { (s.turns) }
                        td { (s.active_turn_id.as_deref().unwrap_or("-")) }
                        td { (s.created_at.to_rfc3339()) }
                    }
                }
            }
            p.note { (found.len()) " session(s), newest first" }
        },
    )
}

/// One session and its turns in order.
pub fn session(view: &SessionView) -> Markup {
    let s = &view.session;
    let id = text(&s["id"]);
    layout(
        &format!("Session {id}"),
        html! {
            table {
                tr { th { "name" } td { (text(&s["name"])) } }
                tr { th { "workspace" } td { (text(&s["workspace_id"])) } }
                tr { th { "repo" } td { (text(&s["repo"])) } }
                tr { th { "tenant" } td { (text(&s["tenant"])) } }
                tr { th { "created" } td { (text(&s["created_at"])) } }
                tr { th { "expires" } td { (text(&s["expires_at"])) } }
            }
            h2 { "Turns" }
            @if view.turns.len() as i64 >= CONSOLE_ROWS {
                p.note { "The newest " (CONSOLE_ROWS) " turns and refusals; `aptix session show " (id) "` prints them all." }
            }
            table {
                tr { th { "#" } th { "turn" } th { "state" } th { "steps done" } th { "admitted" } th { "last change" } }
                @for t in &view.turns {
                    tr {
                        td { (text(&t["seq"])) }
                        td { a href=(format!("/sessions/{id}/turns/{}", text(&t["turn_id"]))) { (text(&t["turn_id"])) } }
                        td { (text(&t["state"])) }
                        td { (text(&t["step"])) }
                        td { (text(&t["created_at"])) }
                        td { (text(&t["updated_at"])) }
                    }
                }
            }
            @if !view.replies.is_empty() {
                h2 { "Refusals sent to this session" }
                (json_block(&Value::Array(view.replies.clone())))
            }
        },
    )
}

/// Queues with their depth, consumers, rates and workers (`missing` says why there are no
/// rates), and the dead letters with their actions.
pub fn queues(
    states: &[QueueState],
    dead: &[DeadLetter],
    admin: bool,
    notice: &str,
    missing: &str,
) -> Markup {
    layout(
        "Queues",
        html! {
            @if !notice.is_empty() { p.notice { (notice) } }
            table {
                tr {
                    th { "queue" } th { "stage" } th { "ready" } th { "consumers" }
                    th { "unacked" } th { "in/s" } th { "acked/s" } th { "workers" }
                }
                @for q in states { (queue_row(q)) }
            }
            @if !missing.is_empty() { p.note { (missing) } }
            h2 { "Dead letters (" (dead.len()) ")" }
            @if !admin { p.note { "Read-only: start the console with an admin token to replay or discard." } }
            @for d in dead { (dead_letter(d, admin)) }
        },
    )
}

fn queue_row(q: &QueueState) -> Markup {
    html! {
        tr {
            td { (q.queue) }
            td { (q.stage.unwrap_or("-")) }
            td { @if q.exists { (q.ready) } @else { "missing" } }
            td { (q.consumers) @if q.stage.is_some() && q.consumers == 0 { " ⚠ no consumer" } }
            @if let Some(a) = &q.activity {
                td { (a.unacked) }
                td.rate { (format!("{:.1}", a.publish_per_s)) }
                td.rate { (format!("{:.1}", a.ack_per_s)) }
                td.workers { @for w in &a.workers { div { (w) } } }
            } @else {
                td { "-" } td { "-" } td { "-" } td { "-" }
            }
        }
    }
}

fn dead_letter(d: &DeadLetter, admin: bool) -> Markup {
    let body = match serde_json::from_slice::<Value>(&d.body) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(&d.body).into_owned(),
    };
    html! {
        section.dead id=(format!("dead-{}", d.id)) {
            h3 { (d.id) }
            table {
                tr { th { "reason" } td.reason { (d.reason) } }
                tr { th { "stage" } td { (d.stage.as_deref().unwrap_or("-")) } }
                tr { th { "original queue" } td { (d.original_queue.as_deref().unwrap_or("-")) } }
                tr { th { "session / turn" } td { (d.session_id.as_deref().unwrap_or("-")) " / " (d.turn_id.as_deref().unwrap_or("-")) } }
            }
            details {
                summary {
                    "body"
                    @if d.body_cut() { " (its first " (d.body.len()) " of " (d.body_bytes) " bytes: `aptix dead show " (d.id) " --queue " (d.queue) "` prints it whole)" }
                }
                pre { (body) }
            }
            @if admin {
                @for action in ["replay", "discard"] {
                    // The id is the client's message id: a form field, never part of a path.
                    form.inline method="post" action=(format!("/dead/{action}")) {
                        input type="hidden" name="id" value=(d.id);
                        input type="hidden" name="queue" value=(d.queue);
                        input type="password" name="token" placeholder="admin token" required;
                        " " button type="submit" name="do" value=(action) { (action) }
                    }
                    " "
                }
            }
        }
    }
}

/// The operator actions log.
pub fn actions(rows: &[OperatorAction]) -> Markup {
    layout(
        "Operator actions",
        html! {
            table {
                tr { th { "when (UTC)" } th { "who" } th { "action" } th { "message" } th { "outcome" } th { "detail" } }
                @for a in rows {
                    tr {
                        td { (a.at.to_rfc3339()) }
                        td { (a.actor) }
                        td { (a.action) }
                        td { (a.message_id) }
                        td { (a.outcome) }
                        td { (a.detail.to_string()) }
                    }
                }
            }
        },
    )
}
