"""Fixtures: the broker URL, the schemas of this repository, and the real pipeline's coordinates.

The real-pipeline tests need `APTIX_TEST_PREFIX` (the pipeline's queue prefix) and
`APTIX_TEST_SIM_URL` (the Responses simulator it calls), as `clients/run-tests.sh` sets them.
Without them those tests are skipped, unless `APTIX_TEST_REQUIRE_PIPELINE=1` makes that an error.
"""

import json
import os
import time
import urllib.request
import uuid
from pathlib import Path

import pika
import pytest

from aptix_client import Schemas

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def amqp_url() -> str:
    return os.environ.get("APTIX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")


@pytest.fixture(scope="session")
def admin_url() -> str:
    """A broker account allowed to create and delete anything (for fakes and clean-up)."""
    return os.environ.get("APTIX_TEST_ADMIN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")


@pytest.fixture(scope="session")
def broker(admin_url):
    try:
        conn = pika.BlockingConnection(pika.URLParameters(admin_url))
    except pika.exceptions.AMQPError as e:
        pytest.skip(f"no RabbitMQ at {admin_url}: {e}")
    conn.close()
    return admin_url


@pytest.fixture(scope="session")
def schemas() -> Schemas:
    return Schemas(os.environ.get("APTIX_SCHEMAS_DIR", ROOT / "schemas"))


class Pipeline:
    def __init__(self, prefix: str, sim_url: str, amqp_url: str):
        self.prefix = prefix
        self.sim_url = sim_url.rstrip("/")
        self.amqp_url = amqp_url


def sim_control(pipeline: Pipeline, command: dict) -> None:
    """`POST /_sim/control` on the simulator the pipeline calls (docs/simulator.md)."""
    req = urllib.request.Request(f"{pipeline.sim_url.removesuffix('/v1')}/_sim/control",
                                 data=json.dumps(command).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 204, r.status


@pytest.fixture(scope="session")
def pipeline(amqp_url) -> Pipeline:
    prefix, sim = os.environ.get("APTIX_TEST_PREFIX"), os.environ.get("APTIX_TEST_SIM_URL")
    if not (prefix and sim):
        if os.environ.get("APTIX_TEST_REQUIRE_PIPELINE") == "1":
            pytest.fail("APTIX_TEST_PREFIX and APTIX_TEST_SIM_URL must be set")
        pytest.skip("no pipeline: run clients/run-tests.sh")
    return Pipeline(prefix, sim, amqp_url)


@pytest.fixture
def prefix() -> str:
    """A prefix of its own for tests that play the server themselves."""
    return "pyc-" + uuid.uuid4().hex[:12]


@pytest.fixture
def fake(broker, prefix):
    """A stand-in server under `prefix` (test_fake_server.FakeServer), stopped afterwards."""
    from test_fake_server import FakeServer

    server = FakeServer(broker, prefix)
    server.start()
    yield server
    server.stop()


def queue_exists(url: str, queue: str) -> bool:
    """A passive declare on a connection of its own to `url`: False when the broker answers 404
    (which closes that channel)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False
    finally:
        if conn.is_open:
            conn.close()


def wait_for(cond, seconds: float = 5.0) -> None:
    """Waits until `cond()` holds, failing the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
