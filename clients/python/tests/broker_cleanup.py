"""Helper of clients/run-tests.sh (not a test): wait until a pipeline's ingress is consumed, or
remove every queue and exchange of a test prefix.

    python broker_cleanup.py --wait-ready PREFIX   # exit 0 once PREFIX.requests has a consumer
    python broker_cleanup.py PREFIX                # delete PREFIX.* queues and exchanges
"""

import os
import subprocess
import sys
import time

import pika

URL = os.environ.get("APTIX_TEST_ADMIN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")


def ready(conn: pika.BlockingConnection, prefix: str) -> bool:
    try:
        ch = conn.channel()
        ch.exchange_declare(f"{prefix}.requests", passive=True)
        ch.exchange_declare(f"{prefix}.replies", passive=True)
        ok = ch.queue_declare(f"{prefix}.requests", passive=True)
        ch.close()
        return ok.method.consumer_count > 0
    except pika.exceptions.ChannelClosedByBroker:
        return False


def wait_ready(prefix: str, seconds: float = 90) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready(conn, prefix):
            conn.close()
            return 0
        time.sleep(0.3)
    print(f"{prefix}.requests has no consumer after {seconds}s", file=sys.stderr)
    return 1


def names(kind: str, prefix: str) -> list:
    try:
        out = subprocess.run(["rabbitmqctl", "-q", f"list_{kind}", "name"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [n for n in out.split() if n.startswith(prefix + ".")]


def cleanup(prefix: str) -> int:
    if not prefix or "." in prefix:
        return 2
    known = [f"{prefix}.{q}" for q in ("requests", "retrieve", "assemble", "invoke", "persist",
                                       "dead", "unrouted")]
    queues = sorted(set(names("queues", prefix) + known))
    exchanges = sorted(set(names("exchanges", prefix) + [f"{prefix}.requests", f"{prefix}.replies"]))
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    for q in queues:
        ch.queue_delete(q)  # deleting a queue that is not there is a no-op in RabbitMQ
    for x in exchanges:
        ch.exchange_delete(x)
    conn.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--wait-ready"]:
        sys.exit(wait_ready(sys.argv[2]))
    sys.exit(cleanup(sys.argv[1]))
