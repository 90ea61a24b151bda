// What the tests' stand-in servers (fake-server.test.ts, cluster.test.ts) declare, as the
// pipeline's workers do: the entry exchange bound to one ingress queue, and the replies exchange;
// and whether a queue exists, as the tests that check what was (not) created ask.
import * as amqp from "amqplib";

/** Declares the stand-in topology under `prefix` and returns the ingress queue's name. */
export async function declareStandIn(ch: amqp.ConfirmChannel, prefix: string): Promise<string> {
  const ingress = `${prefix}.requests`;
  await ch.assertExchange(ingress, "topic", { durable: true });
  await ch.assertQueue(ingress, { durable: true });
  await ch.bindQueue(ingress, ingress, "#");
  await ch.assertExchange(`${prefix}.replies`, "direct", { durable: true });
  return ingress;
}

/** A passive declare on a connection of its own to `url`: false when the broker answers 404. */
export async function queueExists(url: string, queue: string): Promise<boolean> {
  const conn = await amqp.connect(url);
  const ch = await conn.createChannel();
  ch.on("error", () => undefined);
  try {
    await ch.checkQueue(queue);
    return true;
  } catch (e) {
    if (!/404/.test(String(e))) throw e;
    return false;
  } finally {
    await conn.close();
  }
}
