"""Schema checks against the repository's schemas/ (examples must pass, broken documents fail)."""

import json

import pytest

from aptix_client import SchemaError
from conftest import ROOT


def test_examples_match_the_request_schema(schemas):
    for name in ("user-turn.json", "tool-continuation.json"):
        schemas.check_request(json.loads((ROOT / "examples" / name).read_text()))


def test_unknown_request_property_is_refused(schemas):
    with pytest.raises(SchemaError, match="Mode"):
        schemas.check_request({"SessionId": "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f", "TurnId": "t",
                               "Instruction": "x", "Mode": "DDR"})


def test_reply_schema(schemas):
    # Replies always carry Warnings (empty on a failure); the schema requires it.
    schemas.check_reply({"Successful": False, "Result": None,
                         "Errors": [{"Code": "turn.conflict", "Message": "x"}], "Warnings": []})
    with pytest.raises(SchemaError):
        schemas.check_reply({"Successful": False, "Result": None,
                             "Errors": [{"Code": "turn.conflict", "Message": "x"}]})
    with pytest.raises(SchemaError):
        schemas.check_reply({"Successful": True, "Result": {"Kind": "final"}})
    # A reply names its session and turn; each may be absent, never null or malformed.
    failed = {"Successful": False, "Result": None, "Warnings": [],
              "Errors": [{"Code": "llm.unavailable", "Message": "x"}],
              "SessionId": "5f0c6f7e-8a1b-4c2d-9e3f-0a1b2c3d4e5f", "TurnId": "t1"}
    schemas.check_reply(failed)
    schemas.check_reply({k: v for k, v in failed.items() if k != "TurnId"})
    for bad in ({"SessionId": None}, {"SessionId": "not-a-uuid"}, {"TurnId": "t 1"}):
        with pytest.raises(SchemaError):
            schemas.check_reply({**failed, **bad})
