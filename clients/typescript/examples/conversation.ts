// The README's worked conversation, printing every wire message (properties, headers, body): a
// streamed user turn whose answer calls a client tool, the tool results, the streamed follow-up,
// a duplicate of the first turn and a conflicting one.
//
//   APTIX_PREFIX=aptix node dist/examples/conversation.js [AMQP_URL]
//   clients/run-tests.sh target/debug/aptix -- node clients/typescript/dist/examples/conversation.js
import { Client, ToolResult, WireMessage } from "../src";

const DELTAS_SHOWN = 2;

async function drain(it: AsyncIterable<unknown>): Promise<void> {
  for await (const _ of it) void _;
}

async function main(): Promise<void> {
  const url = process.argv[2] ?? process.env.APTIX_TEST_AMQP_URL ?? "amqp://guest:guest@127.0.0.1:5672/%2f";
  const prefix = process.env.APTIX_PREFIX ?? process.env.APTIX_TEST_PREFIX ?? "aptix";
  let hidden = 0;
  const show = (direction: "in" | "out", m: WireMessage) => {
    // Deltas beyond the first few of a step are counted, not printed.
    if (m.properties.type === "delta" && Number(m.headers["x-aptix-seq"]) >= DELTAS_SHOWN) {
      hidden++;
      return;
    }
    if (hidden > 0) console.log(`... ${hidden} more deltas ...\n`);
    hidden = 0;
    if (direction === "out") console.log(`client -> exchange ${m.exchange}, routing key ${m.routingKey}, mandatory`);
    else console.log(`${m.queue} -> client`);
    console.log(`  properties ${JSON.stringify(m.properties)}`);
    console.log(`  headers    ${JSON.stringify(m.headers)}`);
    const body = m.properties.type === "delta" ? JSON.stringify(m.body) : JSON.stringify(m.body, null, 2).replace(/\n/g, "\n  ");
    console.log(`  body       ${body}\n`);
  };
  const client = await Client.connect({ url, prefix, schemas: true, wireLog: show });
  const s = await client.openSession();
  console.log(`# session ${s.sessionId}: declared ${s.queue} (durable, no arguments) and consumed it\n`);

  console.log("# 1. a streamed user turn; the model asks for a client tool");
  const ask = 'Where is the retry policy? @call(read_file, {"path":"src/retry.rs"})';
  await s.submitTurn("turn-1", ask, { stream: true });
  let calls = null;
  for await (const e of s.turnEvents("turn-1")) if (e.type === "tool_calls") calls = e;
  if (!calls) throw new Error("no tool calls");

  console.log("# 2. the tool results, in the order of the calls; the follow-up streams");
  const contents = "pub const RETRY_TIERS_MS: [u64; 4] = [500, 2000, 10000, 30000];";
  await s.submitToolResults("turn-1", calls.calls.map((c) => ToolResult.ok(c, { contents }, 4)));
  await drain(s.turnEvents("turn-1"));

  console.log("# 3. a duplicate: the same TurnId and content again -> the stored reply, no LLM call");
  await s.submitTurn("turn-1", ask, { stream: true });
  await drain(s.turnEvents("turn-1"));

  console.log("# 4. a conflict: the same TurnId with other content -> turn.conflict");
  await s.submitTurn("turn-1", "Something else entirely");
  await drain(s.turnEvents("turn-1"));
  await client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
