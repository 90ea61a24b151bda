// What the tests' stand-in servers (fake-server.test.ts, cluster.test.ts) declare, as the
// pipeline's workers do: the entry exchange bound to one ingress queue, and the replies exchange.
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
