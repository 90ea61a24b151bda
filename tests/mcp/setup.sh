#!/usr/bin/env bash
# Installs the MCP test server's Python environment (tests/mcp/.venv, the official MCP SDK pinned
# in requirements.txt). The tests run it when the environment is missing; it does nothing when the
# environment is already there. Needs python3 (>= 3.10) with venv, and PyPI (or PIP_FIND_LINKS).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
stamp="$venv/.requirements"
# Tests start servers in parallel, each running this: one installs, the others wait for it.
exec 9>"$here/.setup.lock"
flock 9
if [[ -x "$venv/bin/python" ]] && cmp -s "$here/requirements.txt" "$stamp"; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt"
cp "$here/requirements.txt" "$stamp"
