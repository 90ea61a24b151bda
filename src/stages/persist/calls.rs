//! Which of an answer's tool calls the pipeline runs itself (the context's server tools) and
//! which go to the client, and what a final answer lists of the server's executions.

use crate::config::ServerTools;
use crate::contracts::{Outcome, ToolCall, ToolContinuationOutput};
use crate::messages::{server_rounds, ServerExecution};

/// Where an answer goes.
#[derive(Debug)]
pub(super) enum Routed {
    /// A final answer, its `ToolResults` and `Files` listing the turn's server executions.
    Final(Outcome),
    /// Calls for the client: exactly its own, in order. The server's calls of the same answer
    /// run when the client's results come, and every output goes to the model together.
    Client {
        /// The continuation the client receives.
        outcome: Outcome,
        /// The server's calls, still to run.
        server: Vec<ToolCall>,
    },
    /// Only server calls: the pipeline runs them and calls the model again.
    Server(Vec<ToolCall>),
    /// Only server calls, some of which need the client's approval: the client decides on
    /// `gated`, then every call of `server` runs or is answered as denied.
    Approval {
        /// The calls awaiting approval, in the answer's order.
        gated: Vec<ToolCall>,
        /// Every server call of the answer.
        server: Vec<ToolCall>,
        /// The model's text with the calls, if any.
        message: Option<String>,
    },
    /// Server calls past `max_rounds`.
    TooManyRounds(u32),
    /// Not a model's answer (an approval request is what this routing makes of one).
    NotAnAnswer,
}

/// Routes `outcome` given the context's server `tools` and the turn's executions so far.
pub(super) fn route(outcome: Outcome, tools: &ServerTools, executed: &[ServerExecution]) -> Routed {
    match outcome {
        Outcome::Final(mut f) => {
            f.tool_results.extend(executed.iter().map(|e| e.result.clone()));
            f.files.extend(executed.iter().filter_map(|e| e.file.clone()));
            Routed::Final(Outcome::Final(f))
        }
        Outcome::ClientToolContinuation(c) => {
            let (server, client): (Vec<ToolCall>, Vec<ToolCall>) =
                c.tool_calls().iter().cloned().partition(|call| tools.is_server_tool(&call.name));
            if server.is_empty() {
                return Routed::Client { outcome: Outcome::ClientToolContinuation(c), server };
            }
            if server_rounds(executed) >= tools.max_rounds as usize {
                return Routed::TooManyRounds(tools.max_rounds);
            }
            let message = c.message().map(str::to_owned);
            // With client calls in the same answer nothing is asked: a gated call then runs
            // only with an approval the continuation cannot carry, so it is answered as not
            // approved (retrieve decides, `docs/tools.md`, "Approvals").
            let gated: Vec<ToolCall> =
                server.iter().filter(|call| tools.requires_approval(call)).cloned().collect();
            if client.is_empty() && !gated.is_empty() {
                return Routed::Approval { gated, server, message };
            }
            match ToolContinuationOutput::new(client, message) {
                Some(out) => {
                    Routed::Client { outcome: Outcome::ClientToolContinuation(out), server }
                }
                None => Routed::Server(server),
            }
        }
        Outcome::ToolApprovalRequired(_) => Routed::NotAnAnswer,
    }
}

/// How many calls `routed` asks the client about, when more than the `max` results or
/// decisions one submission may carry (`limits.max_tool_results`): no client could answer.
pub(super) fn unanswerable(routed: &Routed, max: usize) -> Option<usize> {
    let asked = match routed {
        Routed::Client { outcome: Outcome::ClientToolContinuation(c), .. } => c.tool_calls().len(),
        Routed::Approval { gated, .. } => gated.len(),
        _ => 0,
    };
    (asked > max).then_some(asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerTool;
    use crate::contracts::{FinalOutput, ToolOutcome, ToolResult};

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall { tool_call_id: id.into(), name: name.into(), arguments_json: "{}".into() }
    }

    fn calls(list: &[ToolCall]) -> Outcome {
        let out = ToolContinuationOutput::new(list.to_vec(), None).unwrap();
        Outcome::ClientToolContinuation(out)
    }

    fn tools() -> ServerTools {
        ServerTools { enabled: vec![ServerTool::SearchCode], max_rounds: 2, ..Default::default() }
    }

    fn executed(step: i32) -> ServerExecution {
        let result = ToolResult {
            tool_call_id: format!("s{step}"),
            name: Some("search_code".into()),
            execution_ms: 1,
            outcome: ToolOutcome::ResultJson("{}".into()),
        };
        ServerExecution { step, call: call(&format!("s{step}"), "search_code"), result, file: None }
    }

    #[test]
    fn the_client_gets_exactly_its_own_calls_in_order() {
        let answer = calls(&[call("a", "read_file"), call("s", "search_code"), call("b", "run")]);
        let Routed::Client { outcome: Outcome::ClientToolContinuation(c), server } =
            route(answer, &tools(), &[])
        else {
            panic!("not a client continuation")
        };
        let ids: Vec<&str> = c.tool_calls().iter().map(|c| c.tool_call_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(server, [call("s", "search_code")]);
    }

    #[test]
    fn more_calls_than_a_client_may_answer_at_once_are_unanswerable() {
        let many: Vec<ToolCall> = (0..3).map(|i| call(&format!("c{i}"), "read_file")).collect();
        let routed = route(calls(&many), &tools(), &[]);
        assert_eq!(unanswerable(&routed, 2), Some(3));
        assert_eq!(unanswerable(&routed, 3), None);
        let server = route(calls(&[call("s", "search_code")]), &tools(), &[]);
        assert_eq!(unanswerable(&server, 0), None, "the server's own calls ask the client nothing");
    }

    #[test]
    fn gated_calls_wait_for_approval_unless_client_calls_come_with_them() {
        let mut tools = tools();
        tools.enabled.push(ServerTool::WriteFile);
        tools.approvals.push(crate::config::ApprovalRule {
            tool: "write_file".into(),
            argument: None,
            matches: None,
        });
        let answer = calls(&[call("s", "search_code"), call("w", "write_file")]);
        let Routed::Approval { gated, server, .. } = route(answer, &tools, &[]) else {
            panic!("no approval asked")
        };
        assert_eq!(gated, [call("w", "write_file")]);
        assert_eq!(server.len(), 2);
        let mixed = calls(&[call("a", "read_file"), call("w", "write_file")]);
        let Routed::Client { server, .. } = route(mixed, &tools, &[]) else {
            panic!("not a client continuation")
        };
        assert_eq!(server, [call("w", "write_file")]);
    }

    #[test]
    fn server_only_answers_run_on_until_the_round_limit() {
        let answer = || calls(&[call("s", "search_code")]);
        assert!(matches!(route(answer(), &tools(), &[executed(0)]), Routed::Server(_)));
        let two = [executed(0), executed(1)];
        assert!(matches!(route(answer(), &tools(), &two), Routed::TooManyRounds(2)));
        let Routed::Final(Outcome::Final(f)) =
            route(Outcome::Final(FinalOutput::text("done")), &tools(), &two)
        else {
            panic!("not final")
        };
        assert_eq!(f.tool_results.len(), 2);
    }
}
