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
    /// Server calls past `max_rounds`.
    TooManyRounds(u32),
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
            match ToolContinuationOutput::new(client, c.message().map(str::to_owned)) {
                Some(out) => {
                    Routed::Client { outcome: Outcome::ClientToolContinuation(out), server }
                }
                None => Routed::Server(server),
            }
        }
    }
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
        ServerTools { enabled: vec![ServerTool::SearchCode], max_rounds: 2, mcp: Vec::new() }
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
