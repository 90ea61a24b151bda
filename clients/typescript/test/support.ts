/** What the tests against the real pipeline share. */
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
