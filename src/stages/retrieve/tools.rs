//! Server-executed tools, run by the retrieve stage because `search_code` needs the vector
//! store it holds: each call the turn carries runs once, and its result joins the turn's
//! continuation next to the client's results, so the next provider call answers every call of
//! the last answer.

use std::time::Instant;

use serde::Deserialize;
use serde_json::json;

use super::Retrieve;
use crate::config::{ConversationContext, ServerTool};
use crate::contracts::{
    FileRef, ScopeCondition, ScopeOperator, ToolCall, ToolContinuation, ToolOutcome, ToolResult,
    UserTurn, ValidatedRequest,
};
use crate::messages::{AdmittedTurn, ServerExecution};
use crate::retrieve::SearchRequest;
use crate::stage::{Cause, StageError};

/// `search_code`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    #[serde(default)]
    path_prefix: Option<String>,
    #[serde(default)]
    language: Option<String>,
}

/// `write_file`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
    #[serde(default)]
    mime_type: Option<String>,
}

/// What one execution produced: the tool's JSON or why it failed, and a file.
pub(super) type Produced = (Result<String, ToolFailure>, Option<FileRef>);

/// Why a server tool call failed: told to the model as the call's error message.
#[derive(Debug, thiserror::Error)]
pub(super) enum ToolFailure {
    /// The context does not run this tool.
    #[error("`{0}` is not a server tool of this context")]
    NotServerTool(String),
    /// The arguments are not the tool's.
    #[error("invalid arguments: {0}")]
    Arguments(#[from] serde_json::Error),
    /// Retrieval failed for good.
    #[error("the search failed: {0}")]
    Search(crate::retrieve::RetrieveError),
    /// The path to write is not a workspace-relative file name.
    #[error("`path` {0}")]
    Path(&'static str),
    /// The content is over the size limit.
    #[error("the content is {bytes} bytes; at most {max} may be written")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// An MCP server gave no output.
    #[error("{0}")]
    Mcp(crate::mcp::McpError),
    /// The call may have taken effect, but no outcome came back (docs/tools.md, "Effects").
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// An earlier attempt's failure, as recorded.
    #[error("{0}")]
    Recorded(String),
    /// Not run, and why.
    #[error("not run: {0}")]
    NotRun(&'static str),
    /// Not run: the call needs approval and was denied, or none was given (the text says which).
    #[error("not run: {0}")]
    NotApproved(String),
}

/// Server tool calls of one answer that run; more are answered "not run".
const MAX_CALLS_PER_STEP: usize = 16;
/// How long one answer's server tool calls may take in all; the rest are answered "not run".
const STEP_BUDGET: std::time::Duration = std::time::Duration::from_secs(600);

impl Retrieve {
    /// Runs `call` once: a built-in, or a tool of one of the context's MCP servers.
    pub(super) async fn run_tool(
        &self,
        call: &ToolCall,
        key: &str,
        turn: &UserTurn,
        job: &AdmittedTurn,
        context: &ConversationContext,
    ) -> Result<Produced, StageError> {
        if let Some((server, tool)) = context.server_tools.mcp_tool(&call.name) {
            let called = self.mcp.call(server, tool, &call.arguments_json, key).await;
            return Ok((called.map_err(ToolFailure::Mcp), None));
        }
        match context.server_tools.runs(&call.name) {
            Some(ServerTool::SearchCode) => self.search_code(call, turn, context).await,
            Some(ServerTool::WriteFile) => self.write_file(call, job.tenant.as_ref()).await,
            None => Ok((Err(ToolFailure::NotServerTool(call.name.clone())), None)),
        }
    }

    /// Runs the turn's server calls; their results join its continuation.
    pub(super) async fn run_server_tools(
        &self,
        mut job: AdmittedTurn,
    ) -> Result<AdmittedTurn, StageError> {
        let turn = job.user_turn().map_err(StageError::fail)?.clone();
        let context =
            super::super::conversation_context(&self.settings, &turn).map_err(StageError::fail)?;
        let calls = std::mem::take(&mut job.server_calls);
        let mut results = Vec::with_capacity(calls.len());
        let step_started = Instant::now();
        for (i, call) in calls.into_iter().enumerate() {
            let started = Instant::now();
            // One answer's server calls hold this stage's message: bounded in number and in
            // time, well inside the broker's delivery acknowledgement timeout (30 min).
            let (outcome, file) = if i >= MAX_CALLS_PER_STEP {
                (Err(ToolFailure::NotRun("more server tool calls in one answer than 16")), None)
            } else if step_started.elapsed() > STEP_BUDGET {
                (
                    Err(ToolFailure::NotRun("the answer's server tool calls took over 10 minutes")),
                    None,
                )
            } else if let Some(why) = not_approved(&job, &call, context) {
                (Err(why), None)
            } else {
                self.run_recorded(&job, &call, &turn, context).await?
            };
            let outcome = match outcome {
                Ok(json) => ToolOutcome::ResultJson(json),
                Err(failure) => ToolOutcome::ErrorMessage(failure.to_string()),
            };
            let execution_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let result = ToolResult {
                tool_call_id: call.tool_call_id.clone(),
                name: None,
                execution_ms,
                outcome,
            };
            results.push(result.clone());
            let result = ToolResult { name: Some(call.name.clone()), ..result };
            job.executed.push(ServerExecution {
                step: job.step - 1,
                call: call.clone(),
                result,
                file,
            });
            job.pending_tool_calls.push(call);
        }
        let mut answered = match job.continuation.take() {
            Some(ValidatedRequest::ToolContinuation(c)) => c.results,
            _ => Vec::new(),
        };
        answered.extend(results);
        let key = job.key.clone();
        job.continuation = Some(ValidatedRequest::ToolContinuation(ToolContinuation {
            key,
            results: answered,
            approvals: Vec::new(),
        }));
        Ok(job)
    }
}

/// Why `call` may not run: it needs approval and the turn's decisions deny it or do not name
/// it. Only decisions the admission matched against the calls it asked about count (the
/// continuation of this round trip); nothing else the turn carries approves a call.
fn not_approved(
    job: &AdmittedTurn,
    call: &ToolCall,
    context: &ConversationContext,
) -> Option<ToolFailure> {
    let decisions = match &job.continuation {
        Some(ValidatedRequest::ToolContinuation(c)) => c.approvals(),
        _ => &[],
    };
    // A decision is kept whatever the configuration says now: a call denied under the rules
    // it was asked under stays denied after they change.
    let decision = decisions.iter().find(|a| a.tool_call_id == call.tool_call_id);
    match decision {
        None if !context.server_tools.requires_approval(call) => None,
        Some(a) if a.approved => None,
        Some(a) if a.message.as_deref() == Some(crate::store::EXPIRY_MESSAGE) => {
            Some(ToolFailure::NotApproved(crate::store::EXPIRY_MESSAGE.to_owned()))
        }
        Some(a) => Some(ToolFailure::NotApproved(a.denial())),
        None => Some(ToolFailure::NotApproved(
            "this call needs the user's approval, which is only asked when an answer calls no \
             client tools; call it again in an answer of its own"
                .to_owned(),
        )),
    }
}

impl Retrieve {
    async fn search_code(
        &self,
        call: &ToolCall,
        turn: &UserTurn,
        context: &ConversationContext,
    ) -> Result<Produced, StageError> {
        let args: SearchArgs = match serde_json::from_str(&call.arguments_json) {
            Ok(a) => a,
            Err(e) => return Ok((Err(e.into()), None)),
        };
        let agent = super::super::agent_context(&self.settings, turn).map_err(StageError::fail)?;
        let mut scope: Vec<ScopeCondition> = turn.rag_scope().to_vec();
        let prefix = args.path_prefix.as_deref().map(|p| p.trim().trim_matches('/'));
        let prefix = prefix.filter(|p| !p.is_empty());
        if let Some(p) = prefix {
            scope.push(ScopeCondition::new("path".into(), ScopeOperator::Contains, vec![p.into()]));
        }
        if let Some(l) = args.language.as_deref().filter(|l| !l.trim().is_empty()) {
            let values = vec![l.trim().to_lowercase()];
            scope.push(ScopeCondition::new("language".into(), ScopeOperator::Eq, values));
        }
        let request = SearchRequest {
            collection: &agent.collection,
            query_text: &args.query,
            repo: turn.repo(),
            scope: &scope,
            top_k: context.top_k,
            budget_chars: context.chunk_budget_chars,
        };
        let found = match self.retrieval.search(request).await {
            Ok(found) => found.chunks,
            Err(e) if e.is_retryable() => return Err(StageError::transient(e)),
            Err(e) => return Ok((Err(ToolFailure::Search(e)), None)),
        };
        let chunks: Vec<_> = found
            .iter()
            .filter(|c| prefix.is_none_or(|p| c.path.trim_start_matches('/').starts_with(p)))
            .map(|c| {
                json!({"Id": c.id, "Path": c.path, "StartLine": c.start_line,
                       "EndLine": c.end_line, "Language": c.language, "Text": c.text})
            })
            .collect();
        Ok((Ok(json!({ "Chunks": chunks }).to_string()), None))
    }

    async fn write_file(
        &self,
        call: &ToolCall,
        tenant: Option<&crate::contracts::TenantName>,
    ) -> Result<Produced, StageError> {
        let args: WriteArgs = match serde_json::from_str(&call.arguments_json) {
            Ok(a) => a,
            Err(e) => return Ok((Err(e.into()), None)),
        };
        let files = &self.settings.files;
        let path = match checked_path(&args.path) {
            Ok(path) => path,
            Err(why) => return Ok((Err(why), None)),
        };
        if args.content.len() > files.max_bytes {
            let why = ToolFailure::TooLarge { bytes: args.content.len(), max: files.max_bytes };
            return Ok((Err(why), None));
        }
        let until = chrono::Utc::now() + chrono::Duration::hours(i64::from(files.retention_hours));
        // The file is the tenant's: its URL is signed for it alone (`crate::files`).
        let Some(keys) = self.settings.pipeline.keys() else {
            return Err(StageError::Permanent(Cause::Unconfigured(
                "no key to sign file urls with",
            )));
        };
        let owner = tenant.map(ToString::to_string).unwrap_or_default();
        let kept = self.store.put_file(&owner, args.content.as_bytes(), until).await?;
        let name = path.rsplit(['/', '\\']).next().unwrap_or(&path).to_owned();
        let file = FileRef {
            name,
            mime_type: args.mime_type.filter(|m| valid_mime(m)).unwrap_or_else(|| mime_of(&path)),
            url: crate::config::file_url(
                &self.settings.files_base_url(),
                &keys,
                &owner,
                &kept.sha256,
                kept.expires_at.timestamp(),
            ),
            size_bytes: kept.size_bytes,
            content_hash: format!("sha256:{}", kept.sha256),
            description: Some(format!("written by write_file as `{path}`")),
            content_expires: Some(
                kept.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ),
        };
        let result = json!({"Path": path, "Url": file.url, "SizeBytes": file.size_bytes,
                            "ContentHash": file.content_hash, "MimeType": file.mime_type});
        Ok((Ok(result.to_string()), Some(file)))
    }
}

/// A workspace-relative path a file may be written as, in the NFKC form request paths are kept
/// in (a CJK name's fullwidth brackets become ASCII ones): its name is what a client saves it
/// as. The checks run on that form, so a look-alike (`‥`, fullwidth `．．`, `：`) is refused as
/// what a client that normalises names would make of it.
fn checked_path(path: &str) -> Result<String, ToolFailure> {
    let line_break = |c| matches!(c, '\u{2028}' | '\u{2029}');
    if crate::contracts::ids::disguising_character(path).is_some()
        || path.contains('\0')
        || path.chars().any(line_break)
    {
        return Err(ToolFailure::Path("must not contain control or invisible format characters"));
    }
    let path: String = unicode_normalization::UnicodeNormalization::nfkc(path).collect();
    check_path(&path)?;
    Ok(path)
}

/// The rules of [`checked_path`] on a path in NFKC form.
fn check_path(path: &str) -> Result<(), ToolFailure> {
    let bad = |why: &'static str| Err(ToolFailure::Path(why));
    if path.trim().is_empty() || path.len() > 512 {
        return bad("must be 1-512 characters");
    }
    if path.starts_with(['/', '\\']) || path.contains(':') {
        return bad("must be workspace-relative (no leading separator, no drive or `:`)");
    }
    if path.split(['/', '\\']).any(|s| matches!(s.trim(), "" | "." | "..")) {
        return bad("must not have empty, `.` or `..` segments");
    }
    Ok(())
}

/// MIME types a `FileRef` may declare: plain data and text a client shows as text.
fn valid_mime(m: &str) -> bool {
    const ALLOWED: [&str; 8] = [
        "text/plain",
        "text/markdown",
        "text/x-diff",
        "text/csv",
        "application/json",
        "application/yaml",
        "application/xml",
        "application/octet-stream",
    ];
    ALLOWED.contains(&m.trim())
        || m.trim().strip_prefix("text/x-").is_some_and(|l| {
            !l.is_empty()
                && l.len() <= 32
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// A MIME type from a file name's extension.
fn mime_of(path: &str) -> String {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "md" => "text/markdown",
        "json" => "application/json",
        "diff" | "patch" => "text/x-diff",
        "csv" => "text/csv",
        "yaml" | "yml" => "application/yaml",
        _ => "text/plain",
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_in_the_workspace() {
        assert_eq!(checked_path("docs/plan.md").ok().as_deref(), Some("docs/plan.md"));
        // A CJK name is written as NFKC makes it, not refused.
        assert_eq!(checked_path("報告書（案）.md").ok().as_deref(), Some("報告書(案).md"));
        let bad = [
            "",
            "/etc/passwd",
            "a/../../b",
            "x\u{0}y",
            "\\\\server\\share",
            "C:\\Windows\\x.dll",
            "C:foo",
            "docs/",
            "a//b",
            "./a",
            "evil\u{202E}txt.exe",
            "\u{2025}/x",
            "\u{FF0E}\u{FF0E}/x",
            "notes\u{E0041}.md",
            "a\u{2028}b",
        ];
        for bad in bad {
            assert!(checked_path(bad).is_err(), "{bad:?}");
        }
        assert_eq!(mime_of("fix.patch"), "text/x-diff");
        assert_eq!(mime_of("README"), "text/plain");
        assert_eq!(mime_of("page.html"), "text/plain");
        assert!(!valid_mime("text plain") && !valid_mime("text/html"));
        assert!(valid_mime("text/x-rust") && valid_mime("application/json"));
    }
}
