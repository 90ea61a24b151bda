//! One turn as the console shows it: a timeline from what PostgreSQL holds (admission, start,
//! each round trip's stages with their waits, durations and retries, each step's record with its
//! LLM call, cancel, end) and the stored payloads behind it.

use maud::{html, Markup};
use serde_json::Value;

use super::charts::{waterfall, Span};
use super::pages::{json_block, layout, text};
use crate::config::ModelPrice;
use crate::contracts::Usage;
use crate::messages::hops;
use crate::store::{SessionView, CONSOLE_ROWS};

/// A turn, its records and what happened when.
pub struct Turn<'a> {
    session_id: String,
    row: &'a Value,
    records: Vec<&'a Value>,
    events: Vec<(String, String, String)>,
    spans: Vec<Span>,
}

impl<'a> Turn<'a> {
    /// Turn `turn_id` of `view`, with its LLM calls priced from `prices`.
    pub fn of(view: &'a SessionView, turn_id: &str, prices: &[ModelPrice]) -> Option<Self> {
        let row = view.turns.iter().find(|t| t["turn_id"] == turn_id)?;
        let mut records: Vec<&Value> =
            view.records.iter().filter(|r| r["turn_id"] == turn_id).collect();
        records.sort_by_key(|r| r["step"].as_i64());
        let mut events = Vec::new();
        let at = |k: &str| row[k].as_str().map(str::to_owned);
        if let Some(t) = at("created_at") {
            events.push((t, "admitted".to_owned(), admitted_detail(row, &view.turns)));
        }
        if let Some(t) = at("started_at") {
            events.push((t, "started".to_owned(), "retrieve, assemble and invoke ran".to_owned()));
        }
        for r in &records {
            events.extend(hop_events(r));
            events.push(step_event(r, prices));
        }
        if let Some(t) = at("cancel_requested_at") {
            events.push((t, "cancel requested".to_owned(), String::new()));
        }
        if let Some(t) = at("updated_at") {
            let state = row["state"].as_str().unwrap_or("-").to_owned();
            events.push((t, format!("now {state}"), "the turn's last change".to_owned()));
        }
        // Stored times and hop times are written differently; order by the instant.
        events.sort_by_key(|e| chrono::DateTime::parse_from_rfc3339(&e.0).ok());
        let session_id = view.session["id"].as_str().unwrap_or_default().to_owned();
        let spans = spans(&records);
        Some(Turn { session_id, row, records, events, spans })
    }
}

/// The waterfall's rows: every stage of every step, from the hops its records stored, in
/// milliseconds from the first stage's start.
fn spans(records: &[&Value]) -> Vec<Span> {
    let paths: Vec<(i64, Vec<hops::Hop>)> = records
        .iter()
        .map(|r| (r["step"].as_i64().unwrap_or_default(), hops::from_stored(&r["stage_timings"])))
        .collect();
    let Some(t0) = paths.iter().flat_map(|(_, p)| p.iter().map(|h| h.received_ms)).min() else {
        return Vec::new();
    };
    let ms = |t: i64| t.saturating_sub(t0) as f64;
    let mut out = Vec::new();
    for (step, path) in &paths {
        let mut sent_before = None;
        for h in path {
            out.push(Span {
                label: format!("step {step}: {}", h.stage),
                wait_from: sent_before.map(ms),
                start: ms(h.received_ms),
                end: ms(h.sent_ms.max(h.received_ms)),
            });
            sent_before = Some(h.sent_ms);
        }
    }
    out
}

/// What the "admitted" row says: queued behind the session's earlier turns only when one was
/// still open as the turn arrived; held when it is queued with none (its tenant's limit).
fn admitted_detail(row: &Value, turns: &[Value]) -> String {
    if queued_behind_earlier(row, turns) {
        "queued behind the session's earlier turns".to_owned()
    } else if row["state"] == "queued" && row["started_at"].is_null() {
        "queued: held until its tenant's limits leave room".to_owned()
    } else {
        String::new()
    }
}

/// Whether an earlier turn of the session (lower `seq`) was still open when `row` was admitted:
/// not finished yet, or finished (its last change) after `row`'s `created_at`.
fn queued_behind_earlier(row: &Value, turns: &[Value]) -> bool {
    let (Some(seq), Some(arrived)) = (row["seq"].as_i64(), instant(&row["created_at"])) else {
        return false;
    };
    turns.iter().any(|t| {
        let earlier = t["seq"].as_i64().is_some_and(|s| s < seq);
        let finished = matches!(t["state"].as_str(), Some("completed" | "failed"));
        earlier && (!finished || instant(&t["updated_at"]).is_some_and(|end| end > arrived))
    })
}

/// A stored time (RFC 3339 text).
fn instant(v: &Value) -> Option<chrono::DateTime<chrono::FixedOffset>> {
    chrono::DateTime::parse_from_rfc3339(v.as_str()?).ok()
}

/// How many steps the turn has done: the row's `step` counts round trips (0 before the first,
/// +1 per record), while steps themselves are numbered from 0 (the records' `step`,
/// `x-aptix-step`), so a one-step turn has done 1 step, step 0.
fn steps_done(row: &Value) -> String {
    match row["step"].as_i64() {
        Some(1) => "1 step done".to_owned(),
        Some(n) => format!("{n} steps done"),
        None => "-".to_owned(),
    }
}

/// One event per stage the record's round trip passed: when it arrived, how long it waited in
/// the queue before (from the previous stage's hand-on) and how long the stage took, with its
/// retries. Records written before hops were stored have none.
fn hop_events(r: &Value) -> Vec<(String, String, String)> {
    let step = r["step"].as_i64().unwrap_or_default();
    let path = hops::from_stored(&r["stage_timings"]);
    let mut sent_before: Option<i64> = None;
    let mut out = Vec::new();
    for h in &path {
        let Some(at) = chrono::DateTime::from_timestamp_millis(h.received_ms) else { continue };
        let mut detail = match sent_before {
            Some(sent) => {
                format!("waited {} ms in its queue; ", h.received_ms.saturating_sub(sent))
            }
            None => String::new(),
        };
        detail += &format!("handled in {} ms", h.sent_ms.saturating_sub(h.received_ms));
        if h.stage == "invoke" {
            detail += " (the LLM call's latency, retries included)";
        }
        if h.attempt > 0 {
            detail += &format!("; retry {} (after a delay queue)", h.attempt);
        }
        if h.redelivered {
            detail += "; redelivered (a worker stopped or died on it)";
        }
        let at = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, false);
        out.push((at, format!("step {step}: {}", h.stage), detail));
        sent_before = Some(h.sent_ms);
    }
    out
}

fn step_event(r: &Value, prices: &[ModelPrice]) -> (String, String, String) {
    let at = r["created_at"].as_str().unwrap_or_default().to_owned();
    let step = r["step"].as_i64().unwrap_or_default();
    let kind = r["kind"].as_str().unwrap_or("-");
    let model = r["request_payload"]["model"].as_str().unwrap_or("-");
    let mut detail = format!("model {model}");
    if let Ok(u) = serde_json::from_value::<Usage>(r["usage"].clone()) {
        detail += &format!(
            "; tokens: {} input ({} cached), {} output ({} reasoning)",
            u.input_tokens, u.cached_input_tokens, u.output_tokens, u.reasoning_tokens
        );
        if let Some(p) = prices.iter().find(|p| p.model == model) {
            detail += &format!("; estimated ${:.6}", p.cost_usd(&u));
        }
    }
    if let Some(id) = r["provider_response_id"].as_str() {
        detail += &format!("; response {id}");
    }
    (at, format!("step {step} recorded: {kind}"), detail)
}

/// The turn's page.
pub fn page(t: &Turn<'_>) -> Markup {
    let turn_id = t.row["turn_id"].as_str().unwrap_or_default();
    let title = format!("Turn {turn_id}");
    layout(
        &title,
        html! {
            p { a href=(format!("/sessions/{}", t.session_id)) { "session " (t.session_id) } }
            p { "State: " strong.state { (text(&t.row["state"])) } " · " (steps_done(t.row)) }
            h2 { "Timeline" }
            table.timeline {
                tr { th { "when (UTC)" } th { "what" } th { "detail" } }
                @for (at, what, detail) in &t.events {
                    tr { td { (at) } td { (what) } td { (detail) } }
                }
            }
            p.note { "Stage rows come from the path each round trip's messages carried (x-aptix-hops); the turn's trace has the same stages as spans." }
            @if !t.spans.is_empty() {
                h2 { "Waterfall" }
                (waterfall(&t.spans))
            }
            h2 { "Request as the client sent it" }
            (json_block(&t.row["request"]))
            @if t.records.len() as i64 >= CONSOLE_ROWS {
                p.note { "The turn's records and its newest reprocessed ones, " (CONSOLE_ROWS) " in all; `aptix session show " (t.session_id) "` prints them all." }
            }
            @for r in &t.records { (record(r)) }
        },
    )
}

fn record(r: &Value) -> Markup {
    let step = text(&r["step"]);
    html! {
        section.record {
            h2 { "Step " (step) ": " (text(&r["kind"])) }
            p.note {
                "record " (text(&r["id"]))
                @if let Some(run) = r["reprocess_run"].as_str() {
                    " · replayed by run " (run) " (of record " (text(&r["reprocess_of"])) ")"
                }
            }
            @if let Some(context) = context_block(&r["request_payload"]) {
                h3 { "[CONTEXT] block" }
                pre.context { (context) }
            }
            h3 { "Retrieved chunks" }
            (chunks(&r["retrieved_chunks"]))
            h3 { "Active files" }
            (json_block(&r["active_files"]))
            h3 { "Skipped files" }
            (json_block(&r["skipped_files"]))
            @if r["errors"].as_array().is_some_and(|e| !e.is_empty()) {
                h3 { "Errors" }
                (json_block(&r["errors"]))
            }
            h3 { "Reply" }
            (json_block(&r["reply"]))
            details {
                summary { "Responses API request" }
                (json_block(&r["request_payload"]))
            }
            details {
                summary { "Responses API answer" }
                (json_block(&r["response_payload"]))
            }
        }
    }
}

fn chunks(v: &Value) -> Markup {
    let list = v.as_array().map(Vec::as_slice).unwrap_or_default();
    html! {
        @if list.is_empty() { p { "none" } } @else {
            table {
                tr { th { "path" } th { "lines" } th { "score" } }
                @for c in list {
                    tr {
                        td { (text(c.get("path").or_else(|| c.get("file_path")).unwrap_or(&Value::Null))) }
                        td { (text(&c["start_line"])) "–" (text(&c["end_line"])) }
                        td { (text(&c["score"])) }
                    }
                }
            }
        }
    }
}

/// The first text of the request that holds the `[CONTEXT]` block.
fn context_block(payload: &Value) -> Option<String> {
    match payload {
        // The block is a part of its own that starts with its header; the system instructions
        // only mention it.
        Value::String(s) if s.starts_with(crate::assemble::CONTEXT_HEADER) => Some(s.clone()),
        Value::Array(items) => items.iter().find_map(context_block),
        Value::Object(map) => map.values().find_map(context_block),
        _ => None,
    }
}
