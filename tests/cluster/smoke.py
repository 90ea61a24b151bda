#!/usr/bin/env python3
"""End-to-end check of tests/cluster/rabbitmq-cluster.sh (stdlib + pika only).

Per cycle: start the 3-node cluster, declare a quorum queue on n1, publish N persistent messages
with publisher confirms, find the leader, SIGKILL it, wait for a new leader, consume everything from
a surviving node (expect exactly N distinct messages), restart the killed node, wait until the 3
members are in sync again, stop. Prints the timings of each step and the nodes' RSS.

    python3 tests/cluster/smoke.py [--cycles 3] [--messages 2000]

Honours APTIX_CLUSTER_DIR / APTIX_CLUSTER_PORT_BASE like the script. Exit status 0 = all good.
"""
import argparse
import os
import subprocess
import sys
import time

import pika

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rabbitmq-cluster.sh")
BASE = os.environ.get("APTIX_CLUSTER_DIR", "/tmp/aptix-cluster")
QUEUE = "aptix.smoke.failover"


def cluster(*args: str) -> str:
    """Runs the script; its stderr goes to ours, its stdout is returned."""
    r = subprocess.run(["bash", SCRIPT, *args], stdout=subprocess.PIPE, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"rabbitmq-cluster.sh {' '.join(args)} exited {r.returncode}")
    return r.stdout


def timed(timings: dict, name: str, fn, *args):
    t = time.monotonic()
    out = fn(*args)
    timings[name] = time.monotonic() - t
    return out


def rss_mib() -> float:
    """Sum of VmRSS of the three node processes (by their pid files), MiB."""
    total = 0
    for i in (1, 2, 3):
        try:
            pid = open(f"{BASE}/n{i}/pid").read().strip()
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url + "?heartbeat=30&connection_attempts=3"))


def declare_and_publish(url: str, n: int) -> None:
    conn = connect(url)
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    # The plugin must be on: declaring its exchange type fails (503) otherwise.
    ch.exchange_declare("aptix.smoke.hash", "x-consistent-hash", auto_delete=True)
    ch.exchange_delete("aptix.smoke.hash")
    ch.confirm_delivery()  # basic_publish now waits for the ack and raises on nack / return
    for i in range(n):
        props = pika.BasicProperties(delivery_mode=2, message_id=str(i))
        ch.basic_publish("", QUEUE, f"message {i}".encode(), props, mandatory=True)
    conn.close()


def consume_all(url: str, n: int, timeout: float = 120.0) -> tuple[int, int]:
    """Consumes until n distinct messages arrived; returns (deliveries, distinct ids)."""
    conn = connect(url)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    seen, deliveries, deadline = set(), 0, time.monotonic() + timeout
    for method, props, _ in ch.consume(QUEUE, inactivity_timeout=1.0):
        if method is not None:
            deliveries += 1
            seen.add(props.message_id)
            ch.basic_ack(method.delivery_tag)
        if len(seen) >= n or time.monotonic() > deadline:
            break
    ch.cancel()
    left = ch.queue_declare(QUEUE, passive=True).method.message_count
    conn.close()
    if left:
        raise RuntimeError(f"{left} messages still in the queue after consuming")
    return deliveries, len(seen)


def cycle(n: int) -> dict:
    t: dict = {}
    urls = timed(t, "start", cluster, "start").split()
    assert len(urls) == 3 and all(u.startswith("amqp://guest:guest@127.0.0.1:") for u in urls), urls
    max_size = cluster("ctl", "-q", "eval", "application:get_env(rabbit, max_message_size).").strip()
    assert max_size == "{ok,16777216}", max_size
    t["rss_idle_mib"] = rss_mib()
    timed(t, "publish", declare_and_publish, urls[0], n)
    t["rss_loaded_mib"] = rss_mib()
    old = int(cluster("leader", QUEUE))
    t0 = time.monotonic()
    cluster("kill", str(old))
    t["kill"] = time.monotonic() - t0
    new = int(cluster("leader", QUEUE))
    t["kill_to_new_leader"] = time.monotonic() - t0  # includes ~1 s of CLI start-up per poll
    assert new != old, (old, new)
    survivor = next(i for i in (1, 2, 3) if i not in (old, new))  # a follower: reads go via the leader
    deliveries, distinct = timed(t, "consume", consume_all, urls[survivor - 1], n)
    assert (deliveries, distinct) == (n, n), f"expected {n} messages, got {deliveries} ({distinct} distinct)"
    timed(t, "restart", cluster, "restart", str(old))
    timed(t, "wait_synced", cluster, "wait-synced", QUEUE)
    timed(t, "stop", cluster, "stop")
    assert not os.path.exists(BASE), f"{BASE} still exists after stop"
    t.update(old_leader=old, new_leader=new, consumed_from=survivor, consumed=deliveries)
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=1)
    ap.add_argument("--messages", type=int, default=2000)
    args = ap.parse_args()
    failed = 0
    for c in range(1, args.cycles + 1):
        try:
            t = cycle(args.messages)
            print(f"cycle {c}: ok " + " ".join(
                f"{k}={v:.1f}{'' if k.endswith('mib') else 's'}" if isinstance(v, float) else f"{k}={v}"
                for k, v in t.items()), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on with the next cycle
            failed += 1
            print(f"cycle {c}: FAILED {type(e).__name__}: {e}", flush=True)
            subprocess.run(["bash", SCRIPT, "stop"], timeout=600)
    print(f"{args.cycles - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
