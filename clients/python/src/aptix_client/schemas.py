"""Optional JSON Schema checks of requests, replies and deltas against the repository's `schemas/`.

Needs the `jsonschema` package (`pip install aptix-client[schemas]`); without it, asking for
validation raises a clear error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

REQUEST_SCHEMA = "agent-execute-request.schema.json"
REPLY_SCHEMA = "invoke-result.schema.json"
DELTA_SCHEMA = "reply-delta.schema.json"


class SchemaError(Exception):
    """A document does not match its schema; `errors` lists each problem with its path."""

    def __init__(self, what: str, errors: List[str]):
        super().__init__(f"{what} does not match its schema: " + "; ".join(errors))
        self.errors = errors


def find_schemas_dir(start: Optional[Path] = None) -> Optional[Path]:
    """`$APTIX_SCHEMAS_DIR`, else the first `schemas/` holding the reply schema above `start`."""
    env = os.environ.get("APTIX_SCHEMAS_DIR")
    if env:
        return Path(env)
    here = (start or Path(__file__)).resolve()
    for d in [here, *here.parents]:
        if (d / "schemas" / REPLY_SCHEMA).is_file():
            return d / "schemas"
    return None


class Schemas:
    """Validators for the request, reply and delta schemas found in one directory.

    A schema file that is absent is not checked (`has(name)` says which are loaded), so the
    client works with repositories that predate a schema.
    """

    def __init__(self, directory: Union[str, Path]):
        try:
            import jsonschema  # noqa: F401  (imported here: an optional dependency)
            from jsonschema import Draft202012Validator
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise RuntimeError("schema validation needs `pip install jsonschema`") from e
        self.directory = Path(directory)
        self._validators: Dict[str, Any] = {}
        for name in (REQUEST_SCHEMA, REPLY_SCHEMA, DELTA_SCHEMA):
            path = self.directory / name
            if path.is_file():
                schema = json.loads(path.read_text(encoding="utf-8"))
                Draft202012Validator.check_schema(schema)
                self._validators[name] = Draft202012Validator(
                    schema, format_checker=Draft202012Validator.FORMAT_CHECKER
                )
        if REPLY_SCHEMA not in self._validators:
            raise FileNotFoundError(f"no {REPLY_SCHEMA} in {self.directory}")

    def has(self, name: str) -> bool:
        return name in self._validators

    def errors(self, name: str, document: Any) -> List[str]:
        v = self._validators.get(name)
        if v is None:
            return []
        return [
            f"{'/'.join(str(x) for x in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(v.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
        ]

    def check(self, name: str, document: Any, what: str) -> None:
        errs = self.errors(name, document)
        if errs:
            raise SchemaError(what, errs)

    def check_request(self, body: Any) -> None:
        self.check(REQUEST_SCHEMA, body, "request")

    def check_reply(self, body: Any, message_id: str = "reply") -> None:
        self.check(REPLY_SCHEMA, body, message_id)

    def check_delta(self, body: Any, message_id: str = "delta") -> None:
        self.check(DELTA_SCHEMA, body, message_id)
