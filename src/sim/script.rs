//! The deterministic "model": what the simulator answers to a valid request.
//!
//! Directives in the instruction text of the newest user message (its `[INSTRUCTION]` section
//! when present, never a `[CONTEXT]` block or replayed history) steer it: `@call(name)`,
//! `@call(name, {json args})`, `@call(*)` (every offered function tool, in order), `@refuse`,
//! `@incomplete`, `@fail`. Only tools sent in `tools` are called; `tool_choice` is obeyed
//! (`none` suppresses calls; a forced function or `required` calls without a directive, as a
//! real model must) and `parallel_tool_calls: false` keeps the first call. Arguments not given
//! are sampled from the tool's JSON Schema. Otherwise the answer is a fixed set of `key: value`
//! lines describing what was received (see README).

use serde_json::Value;

use super::directives::{directives, sample, Directive};
use super::state::Stored;

/// One output item.
#[derive(Debug)]
pub(crate) enum Item {
    Reasoning { id: String },
    Message { id: String, text: String },
    Refusal { id: String, text: String },
    Call { id: String, call_id: String, name: String, arguments: String },
}

/// How the response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Completed,
    Incomplete(&'static str),
    Failed,
}

/// Token figures of one response.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tokens {
    pub input: u64,
    pub cached: u64,
    pub output: u64,
    pub reasoning: u64,
}

/// The simulated answer and the chain facts to store with it.
#[derive(Debug)]
pub(crate) struct Reply {
    pub items: Vec<Item>,
    pub status: Status,
    pub tokens: Tokens,
    pub depth: u32,
    pub system_messages: u64,
}

/// What the request carried.
#[derive(Debug, Default)]
struct Seen<'a> {
    user_texts: Vec<&'a str>,
    /// Where the last user message's texts start in `user_texts`: directives come only from
    /// the newest message, not from history replayed into a rebuilt chain.
    last_user_start: usize,
    system_messages: u64,
    images: usize,
    tool_outputs: Vec<(&'a str, String)>,
    tools: Vec<(&'a str, Option<&'a Value>)>,
}

fn seen(body: &Value) -> Seen<'_> {
    let mut s = Seen::default();
    match body.get("input") {
        Some(Value::String(text)) => s.user_texts.push(text),
        Some(Value::Array(items)) => {
            for item in items {
                match (
                    item.get("type").and_then(Value::as_str),
                    item.get("role").and_then(Value::as_str),
                ) {
                    (Some("function_call_output"), _) => {
                        let call_id =
                            item.get("call_id").and_then(Value::as_str).unwrap_or_default();
                        s.tool_outputs.push((call_id, flatten(item.get("output"))));
                    }
                    (None | Some("message"), Some("system" | "developer")) => {
                        s.system_messages += 1
                    }
                    (None | Some("message"), Some("user")) => {
                        s.last_user_start = s.user_texts.len();
                        user_content(&mut s, item.get("content"));
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    for tool in body.get("tools").and_then(Value::as_array).into_iter().flatten() {
        if let (Some("function"), Some(name)) =
            (tool.get("type").and_then(Value::as_str), tool.get("name").and_then(Value::as_str))
        {
            s.tools.push((name, tool.get("parameters")));
        }
    }
    s
}

fn user_content<'a>(s: &mut Seen<'a>, content: Option<&'a Value>) {
    match content {
        Some(Value::String(text)) => s.user_texts.push(text),
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text") => {
                        s.user_texts.extend(part.get("text").and_then(Value::as_str))
                    }
                    Some("input_image") => s.images += 1,
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// A tool output (string or content parts) as one line of at most 200 characters.
fn flatten(output: Option<&Value>) -> String {
    let text = match output {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    text.replace(['\n', '\r'], " ").chars().take(200).collect()
}

/// The instruction: `[INSTRUCTION]` sections (or whole texts), never `[CONTEXT]` blocks.
fn instruction(texts: &[&str]) -> String {
    let parts = texts.iter().filter(|t| !t.trim_start().starts_with("[CONTEXT]")).map(|t| match t
        .find("[INSTRUCTION]")
    {
        Some(pos) => &t[pos + "[INSTRUCTION]".len()..],
        None => t,
    });
    parts.collect::<Vec<_>>().join("\n")
}

/// Builds the answer to a validated request. `raw_len` is the body size (for input tokens);
/// `id` makes item ids.
pub(crate) fn reply(
    body: &Value,
    raw_len: usize,
    prev: Option<&Stored>,
    id: &dyn Fn(&str) -> String,
) -> Reply {
    let s = seen(body);
    let instruction = instruction(&s.user_texts[s.last_user_start..]);
    let directives = directives(&instruction);
    let depth = prev.map_or(0, |p| p.depth) + 1;
    let system_messages = prev.map_or(0, |p| p.system_messages) + s.system_messages;
    let reasoning = if body.get("reasoning").is_some_and(|r| !r.is_null()) { 64 } else { 0 };
    let mut tokens = Tokens {
        // The prompt cache (`cache`) decides what of the input was cached.
        cached: 0,
        input: prev.map_or(0, |p| p.context_tokens) + (raw_len as u64).div_ceil(4),
        output: reasoning,
        reasoning,
    };
    let mut items = Vec::new();
    if reasoning > 0 {
        items.push(Item::Reasoning { id: id("rs") });
    }
    let reply = |items, status, tokens| Reply { items, status, tokens, depth, system_messages };
    if directives.contains(&Directive::Fail) {
        return reply(Vec::new(), Status::Failed, tokens);
    }
    if directives.contains(&Directive::Refuse) {
        let text = "I'm sorry, but I can't help with that. (simulated refusal)".to_owned();
        tokens.output += 12;
        items.push(Item::Refusal { id: id("msg"), text });
        return reply(items, Status::Completed, tokens);
    }
    let (calls, not_offered) = choose_calls(body, &s, &directives);
    if !calls.is_empty() {
        for (name, arguments) in calls {
            tokens.output += (arguments.len() as u64).div_ceil(4) + 4;
            items.push(Item::Call {
                id: id("fc"),
                call_id: id("call"),
                name: name.to_owned(),
                arguments,
            });
        }
        return reply(items, Status::Completed, tokens);
    }
    let mut text = match judged_answer(body, &s) {
        Some(judged) => judgement(&judged),
        None => answer(&s, &instruction, depth, system_messages, &not_offered),
    };
    let mut status = Status::Completed;
    let max = body.get("max_output_tokens").and_then(Value::as_u64);
    let visible = (text.chars().count() as u64).div_ceil(4);
    if directives.contains(&Directive::Incomplete) || max.is_some_and(|m| reasoning + visible > m) {
        let budget = max.map_or(visible / 2, |m| m.saturating_sub(reasoning).min(visible / 2));
        text = text.chars().take((budget * 4) as usize).collect();
        status = Status::Incomplete("max_output_tokens");
    }
    tokens.output += (text.chars().count() as u64).div_ceil(4);
    items.push(Item::Message { id: id("msg"), text });
    reply(items, status, tokens)
}

/// The calls to make (name, arguments) and the names asked for but not offered.
fn choose_calls<'a>(
    body: &Value,
    s: &Seen<'a>,
    directives: &[Directive],
) -> (Vec<(&'a str, String)>, Vec<String>) {
    let choice = body.get("tool_choice");
    if choice.and_then(Value::as_str) == Some("none") {
        return (Vec::new(), Vec::new());
    }
    let args_for = |params: Option<&Value>| sample(params.unwrap_or(&Value::Null)).to_string();
    let (mut calls, mut not_offered) = (Vec::new(), Vec::new());
    for d in directives {
        let Directive::Call(name, args) = d else { continue };
        if name == "*" {
            calls.extend(s.tools.iter().map(|(n, p)| (*n, args_for(*p))));
        } else if let Some((n, p)) = s.tools.iter().find(|(n, _)| n == name) {
            calls.push((*n, args.clone().unwrap_or_else(|| args_for(*p))));
        } else {
            not_offered.push(name.clone());
        }
    }
    if calls.is_empty() {
        let forced = choice.filter(|c| c.get("type").and_then(Value::as_str) == Some("function"));
        let forced = forced.and_then(|c| c.get("name")).and_then(Value::as_str);
        let pick = match forced {
            Some(name) => s.tools.iter().find(|(n, _)| *n == name),
            None if choice.and_then(Value::as_str) == Some("required") => s.tools.first(),
            None => None,
        };
        calls.extend(pick.map(|(n, p)| (*n, args_for(*p))));
    }
    if body.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
        calls.truncate(1);
    }
    (calls, not_offered)
}

/// The answer a judgement request judges: the `answer` string of the JSON object the newest
/// such user text holds (`{"instruction": …, "answer": …}`), when the request asks for
/// structured output named `judgement` (`text.format`, as `aptix eval`'s judge does).
fn judged_answer(body: &Value, s: &Seen<'_>) -> Option<String> {
    let format = body.pointer("/text/format")?;
    if format["type"] != "json_schema" || format["name"] != "judgement" {
        return None;
    }
    s.user_texts.iter().rev().find_map(|t| {
        let data: Value = serde_json::from_str(t).ok()?;
        data.get("answer")?.as_str().map(str::to_owned)
    })
}

/// The simulator's judgement, as JSON: score 1 when the judged answer is one of its own whole
/// answers (it states the instruction it answered), 0 otherwise, so a test can make an arm
/// worse by construction (its answers cut short).
fn judgement(answer: &str) -> String {
    let whole = answer.lines().any(|l| l.trim_start().starts_with("instruction: "));
    let (score, reason) = if whole {
        (1, "the answer states the instruction it answers")
    } else {
        (0, "the answer does not state the instruction it answers")
    };
    serde_json::json!({ "score": score, "reason": reason }).to_string()
}

/// The default answer: one `key: value` line per fact, so tests can assert on them.
fn answer(
    s: &Seen<'_>,
    instruction: &str,
    depth: u32,
    system_messages: u64,
    not_offered: &[String],
) -> String {
    let first_line = instruction.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
    let (mut chunks, mut ids, mut expect_id) = (0, Vec::new(), false);
    for line in s.user_texts.iter().flat_map(|t| t.lines()) {
        if line.starts_with("=== CHUNK ") && line.ends_with(" ===") {
            chunks += 1;
            expect_id = true;
        } else if let (true, Some(id)) = (expect_id, line.strip_prefix("Id: ")) {
            ids.push(id.trim());
            expect_id = false;
        }
    }
    let tools: Vec<&str> = s.tools.iter().map(|(n, _)| *n).collect();
    let mut lines = vec![
        "Simulated answer from the Aptix Responses simulator.".to_owned(),
        format!("instruction: {}", first_line.chars().take(120).collect::<String>()),
        if ids.is_empty() {
            format!("context_chunks: {chunks}")
        } else {
            format!("context_chunks: {chunks} ({})", ids.join(", "))
        },
        format!("images: {}", s.images),
        format!("tool_outputs: {}", s.tool_outputs.len()),
    ];
    lines.extend(s.tool_outputs.iter().map(|(id, out)| format!("tool_output {id}: {out}")));
    lines.push(format!("chain_depth: {depth}"));
    lines.push(format!("system_messages_in_chain: {system_messages}"));
    lines.push(format!(
        "tools_offered: {}",
        if tools.is_empty() { "none".to_owned() } else { tools.join(", ") }
    ));
    if !not_offered.is_empty() {
        lines.push(format!("tools_not_offered: {}", not_offered.join(", ")));
    }
    lines.join("\n")
}
