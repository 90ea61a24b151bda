/** What the tests share: the simulator's control (against the real pipeline), a wait. */
import assert from "node:assert/strict";

/** `POST /_sim/control` on the simulator the pipeline calls (docs/simulator.md). */
export async function simControl(command: unknown): Promise<void> {
  const sim = process.env.APTIX_TEST_SIM_URL;
  const res = await fetch(`${sim!.replace(/\/v1\/?$/, "")}/_sim/control`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(command),
  });
  assert.equal(res.status, 204, await res.text());
}

/** Waits until `cond()` holds, failing the test after `ms`. */
export async function until(cond: () => boolean, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    assert.ok(Date.now() < deadline, "timed out");
    await new Promise((r) => setTimeout(r, 20));
  }
}
