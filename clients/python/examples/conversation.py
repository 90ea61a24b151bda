"""The README's worked conversation, printing every wire message (properties, headers, body):
a streamed user turn whose answer calls a client tool, the tool results, the streamed follow-up,
a duplicate of the first turn and a conflicting one.

    APTIX_PREFIX=aptix python examples/conversation.py [AMQP_URL]
    clients/run-tests.sh target/debug/aptix -- \
        clients/python/.venv/bin/python clients/python/examples/conversation.py
"""

import json
import os
import sys

from aptix_client import Client, ToolCalls, ToolResult

DELTAS_SHOWN = 2


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "APTIX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    prefix = os.environ.get("APTIX_PREFIX") or os.environ.get("APTIX_TEST_PREFIX", "aptix")
    hidden = {"deltas": 0}

    def show(direction: str, msg: dict) -> None:
        # Deltas beyond the first few of a step are counted, not printed.
        is_delta = msg["properties"].get("type") == "delta"
        if is_delta and msg["headers"].get("x-aptix-seq", 0) >= DELTAS_SHOWN:
            hidden["deltas"] += 1
            return
        if hidden["deltas"]:
            print(f"... {hidden['deltas']} more deltas ...\n")
            hidden["deltas"] = 0
        if direction == "out":
            print(f"client -> exchange {msg['exchange']}, routing key {msg['routing_key']}, mandatory")
        else:
            print(f"{msg['queue']} -> client")
        print(f"  properties {json.dumps(msg['properties'])}")
        print(f"  headers    {json.dumps(msg['headers'])}")
        body = json.dumps(msg["body"], indent=2).replace("\n", "\n  ")
        print(f"  body       {body}\n" if msg["properties"].get("type") != "delta"
              else f"  body       {json.dumps(msg['body'])}\n")

    with Client(url, prefix, schemas=True, wire_log=show) as client:
        s = client.open_session()
        print(f"# session {s.session_id}: declared {s.queue} (durable, no arguments) and consumed it\n")

        print("# 1. a streamed user turn; the model asks for a client tool")
        s.submit_turn("turn-1", 'Where is the retry policy? @call(read_file, {"path":"src/retry.rs"})',
                      stream=True)
        calls = [e for e in s.turn_events("turn-1") if isinstance(e, ToolCalls)][0]

        print("# 2. the tool results, in the order of the calls; the follow-up streams")
        contents = "pub const RETRY_TIERS_MS: [u64; 4] = [500, 2000, 10000, 30000];"
        s.submit_tool_results("turn-1", [ToolResult.ok(c, {"contents": contents}, 4) for c in calls.calls])
        list(s.turn_events("turn-1"))

        print("# 3. a duplicate: the same TurnId and content again -> the stored reply, no LLM call")
        s.submit_turn("turn-1", 'Where is the retry policy? @call(read_file, {"path":"src/retry.rs"})',
                      stream=True)
        list(s.turn_events("turn-1"))

        print("# 4. a conflict: the same TurnId with other content -> turn.conflict")
        s.submit_turn("turn-1", "Something else entirely")
        list(s.turn_events("turn-1"))


if __name__ == "__main__":
    main()
