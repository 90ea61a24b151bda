#!/usr/bin/env bash
# Tests of the official clients (clients/python, clients/typescript) against the REAL pipeline.
#
#   clients/run-tests.sh PATH/TO/aptix                 # install deps, start everything, run both suites
#   clients/run-tests.sh PATH/TO/aptix -- CMD ARGS...  # same environment, run CMD instead of the suites
#   CLIENTS_PREFIX=NAME clients/run-tests.sh ...        # a chosen queue prefix instead of cl-<random>
#   CLIENTS_TENANTS=1 clients/run-tests.sh ...          # tenant mode: two tenants, only the tenancy tests
#   CLIENTS_SUITE=python|typescript clients/run-tests.sh ...  # one suite only (default: both)
#   CLIENTS_DEPS=only|skip clients/run-tests.sh ...     # install the dependencies and stop, or use
#                                                       # those installed (runs side by side: .ci/run)
#
# It installs the Python package into clients/python/.venv (pip) and the Node packages (npm ci;
# not with CLIENTS_DEPS=skip, which needs an earlier CLIENTS_DEPS=only), starts `aptix sim` and
# the pipeline (`aptix migrate`, `aptix index`, `aptix run`) with a random queue prefix, a fresh
# database and a temporary vector store, creates a broker user with exactly the `aptix-client`
# permissions of docs/client-protocol.md for that prefix (when rabbitmqctl works; guest
# otherwise), runs pytest then `node --test` (or the one CLIENTS_SUITE names), stops everything
# (SIGTERM, wait), removes what it created, and exits non-zero on any failure.
#
# Tenant mode (CLIENTS_TENANTS=1) runs the same pipeline with a configuration file (APTIX_CONFIG,
# over the built-in defaults) that adds two tenants, ta<rand6> and tb<rand6>, each with a broker
# user of its own (aptix-tenant-<rand>-a, -b, random passwords) holding exactly its tenant's
# permissions (configure/read ^P\.(session|instance)\.T\..*, write ^P\.requests$), and a second
# conversation context `other` that both may name (aptix.example.toml's
# [conversation_contexts.default], tools included, with another mode). It exports
# APTIX_TEST_TENANTS=1, APTIX_TEST_TENANT_A / _B (the names), APTIX_TEST_TENANT_A_URL / _B_URL
# (the users' URLs), APTIX_TEST_OTHER_CONVERSATION_CONTEXT and APTIX_TEST_SPENT_CONVERSATION_CONTEXT
# (a third context, whose money budget any call would pass), runs only tests/test_tenancy.py and
# dist/test/tenancy.test.js (which skip in the default mode), and deletes the users afterwards.
# It needs rabbitmqctl.
#
# Needs RabbitMQ on 127.0.0.1:5672 (guest/guest) and PostgreSQL on 127.0.0.1:5432 (postgres,
# trust), python3 (>= 3.10) and Node 20 with npm.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
aptix="${1:?usage: clients/run-tests.sh PATH/TO/aptix [-- CMD ...]}"
shift
[[ "${1:-}" == "--" ]] && shift
aptix="$(cd "$(dirname "$aptix")" && pwd)/$(basename "$aptix")"
[[ -x "$aptix" ]] || { echo "not an executable: $aptix" >&2; exit 2; }

log() { printf '\n== clients: %s\n' "$*"; }
die() { echo "clients: $*" >&2; exit 1; }

rand="$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
prefix="${CLIENTS_PREFIX:-cl-$rand}"
db="aptix_clients_$rand"
admin_url="${APTIX_TEST_ADMIN_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
work="$(mktemp -d)"
venv="$here/python/.venv"
sim_pid="" run_pid="" client_user="" py=""
tenant_mode="" tenant_users=""

stop() { # SIGTERM, then wait for the process to exit
  local pid=$1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  wait "$pid" 2>/dev/null
}

cleanup() {
  stop "$run_pid"
  stop "$sim_pid"
  if [[ -n "$py" ]]; then
    APTIX_TEST_ADMIN_AMQP_URL="$admin_url" "$py" "$here/python/tests/broker_cleanup.py" "$prefix" \
      || echo "clients: could not remove the broker objects of $prefix" >&2
  fi
  [[ -n "$client_user" ]] && rabbitmqctl -q delete_user "$client_user" >/dev/null 2>&1
  for user in $tenant_users; do rabbitmqctl -q delete_user "$user" >/dev/null 2>&1; done
  psql -h 127.0.0.1 -U postgres -d postgres -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ "${CLIENTS_TENANTS:-}" == 1 ]]; then
  command -v rabbitmqctl >/dev/null 2>&1 || die "CLIENTS_TENANTS=1 needs rabbitmqctl (it creates the tenants' users)"
  tenant_mode=1
  tenant_a="ta${rand:0:6}" tenant_b="tb${rand:0:6}"
  tenant_user_a="aptix-tenant-$rand-a" tenant_user_b="aptix-tenant-$rand-b"
  other_context=other spent_context=spent
fi

# Tenant mode: the pipeline's configuration over the built-in defaults. Tenant A has the default
# agent context; an agent context (its key and collection) serves one tenant only, so B has its
# own. The second conversation context is aptix.example.toml's [conversation_contexts.default]
# (its [[...tools]] too, comments left out) under another id and mode.
write_tenant_config() {
  cat <<EOF
[tenants.$tenant_a]
users = ["$tenant_user_a"]
agent_contexts = ["default", "${tenant_a}_alt"]
conversation_contexts = ["default", "$other_context", "$spent_context"]

[tenants.$tenant_b]
users = ["$tenant_user_b"]
agent_contexts = ["$tenant_b"]
conversation_contexts = ["default", "$other_context", "$spent_context"]

[agent_contexts.$tenant_b]
collection = "aptix_$tenant_b"

# A second agent context of A's: a later turn naming it gets session.context_fixed.
[agent_contexts.${tenant_a}_alt]
collection = "aptix_${tenant_a}_alt"

EOF
  copy_default_context "$other_context" OTHER Other
  # A third whose money budget (docs/tenancy.md §7a) is spent by any call: its turns fail with
  # limit.budget_exhausted before their call.
  copy_default_context "$spent_context" SPENT Spent \
    | sed -e "/^\[conversation_contexts\.$spent_context\]\$/a max_output_tokens = 256\nusd_per_month = 0.000001"
}

# copy_default_context ID MODE DISPLAY: aptix.example.toml's [conversation_contexts.default] (its
# [[...tools]] too, comments left out) under another id and mode.
copy_default_context() {
  awk '
    !str && /^\[/ { on = /^\[\[?conversation_contexts\.default[].]/ }
    on && !str && /^#/ { next }
    on { print }
    { if (gsub(/"""/, "&") % 2) str = !str }  # inside a multi-line string no line is a header
  ' "$here/../aptix.example.toml" \
    | sed -e "/^\[/s/conversation_contexts\.default/conversation_contexts.$1/" \
      -e "s/^mode = .*/mode = \"$2\"/" -e "s/^mode_display_name = .*/mode_display_name = \"$3\"/"
}

# Default mode: a ConversationContext `gated`, aptix.example.toml's default whose `write_file`
# calls under `deploy/` wait for the client's approval (docs/tools.md, "Approvals").
write_gated_config() {
  copy_default_context gated GATED Gated \
    | sed -e 's/^approval_expiry_seconds = .*/approval_expiry_seconds = 60/'
  cat <<EOF

[[conversation_contexts.gated.server_tools.approvals]]
tool = "write_file"
argument = "/path"
matches = "^deploy/"
EOF
}

add_tenant_user() { # USER TENANT: prints the URL of a new broker user with the permissions of TENANT's clients
  local user=$1 tenant=$2 pass
  pass="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
  rabbitmqctl -q add_user "$user" "$pass" >/dev/null 2>&1 || return 1
  rabbitmqctl -q set_permissions -p / "$user" "^$p\\.(session|instance)\\.$tenant\\..*" "^$p\\.requests\$" \
    "^$p\\.(session|instance)\\.$tenant\\..*" >/dev/null 2>&1 || return 1
  echo "amqp://$user:$pass@127.0.0.1:5672/%2f"
}

# Python's package into clients/python/.venv (or for the user, without venv) and Node's packages.
install_dependencies() {
  log "python dependencies (clients/python/.venv)"
  if [[ ! -x "$py" ]] && ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # No venv module (Debian without python3-venv): install for this user instead.
    rm -rf "$venv"
    py=python3
    echo "python3 -m venv is unavailable; installing with pip --user"
  fi
  if [[ "$py" == python3 ]]; then
    python3 -m pip install --quiet --disable-pip-version-check --user -e "$here/python[test]" \
      || python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages -e "$here/python[test]" \
      || die "pip install --user failed"
  else
    "$py" -m pip install --quiet --disable-pip-version-check -e "$here/python[test]" || die "pip install failed"
  fi

  log "node dependencies (npm ci) and build (tsc)"
  (cd "$here/typescript" && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build) \
    || die "npm ci / tsc failed"
}
suite="${CLIENTS_SUITE:-both}" deps="${CLIENTS_DEPS:-install}"
[[ "$suite" =~ ^(both|python|typescript)$ ]] || die "CLIENTS_SUITE must be both, python or typescript"
[[ "$deps" =~ ^(install|only|skip)$ ]] || die "CLIENTS_DEPS must be install, only or skip"
py="$venv/bin/python"
if [[ "$deps" == skip ]]; then
  # Installed by an earlier `CLIENTS_DEPS=only` run: several runs side by side must not install
  # into one venv or node_modules at once.
  [[ -x "$py" ]] || py=python3
  "$py" -c 'import aptix_client, pika' 2>/dev/null \
    || die "CLIENTS_DEPS=skip: the Python client is not installed; run with CLIENTS_DEPS=only first"
  [[ "$suite" == python || -d "$here/typescript/dist/test" ]] \
    || die "CLIENTS_DEPS=skip: the TypeScript client is not built; run with CLIENTS_DEPS=only first"
else
  install_dependencies
  [[ "$deps" == only ]] && { py=""; exit 0; }
fi
log "simulator and pipeline (prefix $prefix, database $db)"
export APTIX__AMQP__PREFIX="$prefix"
export APTIX__DATABASE__URL="postgres://postgres@127.0.0.1:5432/$db"
export APTIX__VECTOR__DATA_DIR="$work/vectors"
export APTIX__TELEMETRY__METRICS_LISTEN=""
export RUST_LOG="${RUST_LOG:-warn}"
unset APTIX_CONFIG APTIX_TEST_TENANTS APTIX_TEST_GATED_CONVERSATION_CONTEXT
if [[ -z "$tenant_mode" ]]; then
  write_gated_config >"$work/clients.toml" || die "could not write the clients' configuration"
  export APTIX_CONFIG="$work/clients.toml" APTIX_TEST_GATED_CONVERSATION_CONTEXT=gated
fi
if [[ -n "$tenant_mode" ]]; then
  write_tenant_config >"$work/tenants.toml" || die "could not write the tenants' configuration"
  grep -q "^\[conversation_contexts\.$other_context\]" "$work/tenants.toml" \
    || die "aptix.example.toml has no [conversation_contexts.default] to copy"
  export APTIX_CONFIG="$work/tenants.toml"
  echo "tenants $tenant_a ($tenant_user_a) and $tenant_b ($tenant_user_b): APTIX_CONFIG=$APTIX_CONFIG"
fi

"$aptix" sim --listen 127.0.0.1:0 >"$work/sim.out" 2>"$work/sim.log" &
sim_pid=$!
for _ in $(seq 1 100); do
  [[ -s "$work/sim.out" ]] && break
  kill -0 "$sim_pid" 2>/dev/null || break
  sleep 0.1
done
sim_url="$(head -n1 "$work/sim.out")"
[[ "$sim_url" == http* ]] || { cat "$work/sim.log" >&2; die "aptix sim printed no base URL"; }
export APTIX__LLM__BASE_URL="$sim_url"
echo "simulator at $sim_url"

"$aptix" migrate >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log" >&2; die "aptix migrate failed"; }
"$aptix" index "$here/python/src" --repo clients >"$work/index.log" 2>&1 \
  || { cat "$work/index.log" >&2; die "aptix index failed"; }
"$aptix" run >"$work/run.log" 2>&1 &
run_pid=$!
APTIX_TEST_ADMIN_AMQP_URL="$admin_url" "$py" "$here/python/tests/broker_cleanup.py" --wait-ready "$prefix" \
  || { cat "$work/run.log" >&2; die "the pipeline did not start"; }
echo "pipeline running (pid $run_pid)"

client_url="$admin_url"
p="${prefix//./\\.}"
if command -v rabbitmqctl >/dev/null 2>&1; then
  user="aptix-client-$rand" pass="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
  if rabbitmqctl -q add_user "$user" "$pass" >/dev/null 2>&1; then
    client_user="$user"
    if rabbitmqctl -q set_permissions -p / "$user" "^$p\\.(session|instance)\\..*" "^$p\\.requests\$" "^$p\\.(session|instance)\\..*" >/dev/null 2>&1; then
      client_url="amqp://$user:$pass@127.0.0.1:5672/%2f"
      echo "clients connect as $user (configure/read ^$p\\.(session|instance)\\..*, write ^$p\\.requests\$)"
    fi
  fi
fi
[[ "$client_url" == "$admin_url" ]] && echo "clients connect as the admin account (rabbitmqctl unavailable)"

if [[ -n "$tenant_mode" ]]; then
  tenant_users="$tenant_user_a $tenant_user_b"
  tenant_url_a="$(add_tenant_user "$tenant_user_a" "$tenant_a")" || die "could not create broker user $tenant_user_a"
  tenant_url_b="$(add_tenant_user "$tenant_user_b" "$tenant_b")" || die "could not create broker user $tenant_user_b"
  echo "tenant clients connect as $tenant_user_a and $tenant_user_b (configure/read ^$p\\.(session|instance)\\.<tenant>\\..*, write ^$p\\.requests\$)"
  export APTIX_TEST_TENANTS=1 APTIX_TEST_TENANT_A="$tenant_a" APTIX_TEST_TENANT_B="$tenant_b"
  export APTIX_TEST_TENANT_A_URL="$tenant_url_a" APTIX_TEST_TENANT_B_URL="$tenant_url_b"
  export APTIX_TEST_OTHER_CONVERSATION_CONTEXT="$other_context"
  export APTIX_TEST_SPENT_CONVERSATION_CONTEXT="$spent_context"
  export APTIX_TEST_OTHER_AGENT_CONTEXT="${tenant_a}_alt"
fi

export APTIX_TEST_PREFIX="$prefix" APTIX_TEST_SIM_URL="$sim_url" APTIX_TEST_AMQP_URL="$client_url" APTIX_TEST_BIN="$aptix"
export APTIX_TEST_ADMIN_AMQP_URL="$admin_url" APTIX_TEST_REQUIRE_PIPELINE=1 APTIX_CLIENTS_WORK="$work"
export APTIX_SCHEMAS_DIR="${APTIX_SCHEMAS_DIR:-$(cd "$here/.." && pwd)/schemas}"

if [[ $# -gt 0 ]]; then
  "$@"
  exit $?
fi

py_tests=tests node_tests=dist/test/
if [[ -n "$tenant_mode" ]]; then
  py_tests=tests/test_tenancy.py node_tests=dist/test/tenancy.test.js
fi

py_rc=0 node_rc=0
touch "$work/pytest.out" "$work/node.out"
if [[ "$suite" != typescript ]]; then
  log "python client: pytest $py_tests"
  (cd "$here/python" && timeout 600 "$py" -m pytest -q -p no:cacheprovider "$py_tests") | tee "$work/pytest.out"
  py_rc=${PIPESTATUS[0]}
fi
if [[ "$suite" != python ]]; then
  log "typescript client: node --test $node_tests"
  (cd "$here/typescript" && timeout 600 node --test --test-reporter=tap "$node_tests") >"$work/node.out" 2>&1
  node_rc=$?
fi
grep -E '^(not ok|# Subtest)' "$work/node.out" | grep -B1 '^not ok' || true
[[ $node_rc -ne 0 ]] && tail -n 80 "$work/node.out"
grep -E '^# (tests|suites|pass|fail|cancelled|skipped|todo|duration_ms) ' "$work/node.out"

if [[ $py_rc -ne 0 || $node_rc -ne 0 ]]; then
  log "pipeline log (last 60 lines)"
  tail -n 60 "$work/run.log"
fi

py_pass=$(grep -Eo '[0-9]+ passed' "$work/pytest.out" | tail -n1 | grep -Eo '[0-9]+' || echo 0)
py_fail=$(grep -Eo '[0-9]+ (failed|errors?)' "$work/pytest.out" | awk '{s+=$1} END {print s+0}')
node_pass=$(sed -n 's/^# pass //p' "$work/node.out" | tail -n1)
node_fail=$(sed -n 's/^# fail //p' "$work/node.out" | tail -n1)
passed=$((py_pass + ${node_pass:-0}))
failed=$((${py_fail:-0} + ${node_fail:-0}))
[[ $py_rc -ne 0 || $node_rc -ne 0 ]] && [[ $failed -eq 0 ]] && failed=1
echo
echo "clients: $passed passed, $failed failed"
[[ $py_rc -eq 0 && $node_rc -eq 0 ]]
