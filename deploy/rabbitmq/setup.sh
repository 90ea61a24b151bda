#!/usr/bin/env bash
# Creates or updates Aptix's RabbitMQ users, their permissions on the vhost `/` and the queue
# policies, on the node this machine's `rabbitmqctl` reaches. Idempotent: run it again after a
# password change or an upgrade. Everything goes in one `rabbitmqctl import_definitions` (each
# rabbitmqctl call costs about a second).
#
#   deploy/rabbitmq/setup.sh [--dev] [--print] [PREFIX_REGEX]
#
# PREFIX_REGEX  the queue-name prefix (`amqp.prefix`), as a regular expression. The default,
#               `[A-Za-z0-9_-]+`, matches every prefix: the local machine's tests (`t-<12 hex>`),
#               `aptix` and the demo's `aptix-demo`. A deployment passes its own: `setup.sh aptix`.
# --dev         a development broker: a password not given is its development default
#               (`<user>-dev`). Without --dev every password must be given, or nothing is done.
# --print       prints the definitions instead of importing them (passwords shown as ***).
#
# Environment:
#   APTIX_DEPLOYMENT       names the users, so that deployments sharing a broker never reset
#                          each other's: `<deployment>-worker`, ... Default `aptix`.
#   APTIX_WORKER_PASSWORD  password of `<deployment>-worker` (the workers' amqp.url)
#   APTIX_CLIENT_PASSWORD  password of `<deployment>-client` (the backends)
#   APTIX_MONITOR_PASSWORD password of `<deployment>-monitor` (KEDA: queue depths only)
#   APTIX_CONSOLE_PASSWORD password of `<deployment>-console` (the web console, `aptix dead`)
#   APTIX_<USER>_PASSWORD_FILE
#                          a file holding one instead (a mounted Secret follows its updates)
#   APTIX_RABBITMQ_NODE    node to manage (rabbitmqctl -n), when not the local default
#   APTIX_SHARED_CLIENT    `no` for a deployment with tenants (docs/tenancy.md): the shared
#                          `<deployment>-client` user, which may read every tenant's reply
#                          queues, is not created, and deleted if it exists; tenants' users come
#                          from add-tenant.sh
#
# The users (docs/client-protocol.md, docs/deploy.md "RabbitMQ users"), D = the deployment:
#   D-worker   configure, read: ^P\..*   write: ^P\..* and amq.default (the workers publish
#              stage messages and dead letters through the default exchange, and the delay
#              queues dead-letter into it); tag `management` (rates in `aptix status`)
#   D-client   write: ^P\.requests$ (the entry exchange only, not the default exchange, so a
#              client cannot publish into a stage queue); configure, read:
#              ^P\.(session|instance)\..* (its reply queues: per session, or per backend
#              instance)
#   D-monitor  no configure, write or read permission: it reads queue depths (a passive
#              declare over AMQP, or the management API with its tag `management`), which is
#              all KEDA needs
#   D-console  read: ^P\.dead(\.<tenant>)?$ (looking at dead letters, taking one); write: the entry
#              exchange and amq.default (a replay); no configure; tag `management` (rates)
# Plugins (both ship with RabbitMQ): rabbitmq_consistent_hash_exchange, for ingress partitions;
#   rabbitmq_management, for rates and workers in `aptix status` and the console (and KEDA).
# Policies (RabbitMQ's convention for bounds and expiry; queues are declared without x-args):
#   P-sessions  ^P\.session\.   expires 24 h, max-length 10000 (drop-head: replies are also in
#                               PostgreSQL)
#   P-instances ^P\.instance\.  expires 24 h, max-length 100000 (drop-head: replies are also in
#                               PostgreSQL)
#   P-dead      ^P\.dead$       max-length 100000, max-length-bytes 1 GiB, message-ttl 14 days
#   P-unrouted  ^P\.unrouted$   the same bounds as P-dead
#   P-dead-tenant, P-unrouted-tenant  ^P\.(dead|unrouted)\.<tenant>$  a tenant's own (made by its
#                               first message): max-length 10000, max-length-bytes 256 MiB,
#                               message-ttl 14 days, oldest dropped first, so a tenant's flood
#                               evicts only its own
# where P is PREFIX_REGEX and the policy names use it when it is a plain name, else `aptix-any`.
set -euo pipefail

print=false dev=false
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --print) print=true ;;
    --dev) dev=true ;;
    *) echo "usage: $0 [--dev] [--print] [PREFIX_REGEX]" >&2; exit 2 ;;
  esac
  shift
done
if (($# > 1)); then
  echo "usage: $0 [--dev] [--print] [PREFIX_REGEX]" >&2
  exit 2
fi
prefix="${1:-[A-Za-z0-9_-]+}"

die() {
  echo "setup.sh: $*" >&2
  exit 1
}

deployment="${APTIX_DEPLOYMENT:-aptix}"
[[ "$deployment" =~ ^[A-Za-z0-9_-]+$ ]] || die "APTIX_DEPLOYMENT must be letters, digits, _ or -"
worker="$deployment-worker" client="$deployment-client"
monitor="$deployment-monitor" console="$deployment-console"

# The password in $1, or in the file named by $1_FILE (trailing newlines dropped); with --dev
# (or --print, which shows none) an unset one is the development default $2.
password() {
  local file_var="${1}_FILE"
  if [[ -n "${!file_var:-}" ]]; then
    [[ -r "${!file_var}" ]] || die "$file_var: cannot read ${!file_var}"
    printf '%s' "$(<"${!file_var}")"
  elif [[ -n "${!1:-}" ]]; then
    printf '%s' "${!1}"
  elif $dev || $print; then
    printf '%s' "$2"
  else
    die "$1 (or $file_var) is not set, and this is no development broker: set it, or pass --dev to use the development password"
  fi
}
worker_password="$(password APTIX_WORKER_PASSWORD "$worker-dev")"
client_password="$(password APTIX_CLIENT_PASSWORD "$client-dev")"
monitor_password="$(password APTIX_MONITOR_PASSWORD "$monitor-dev")"
console_password="$(password APTIX_CONSOLE_PASSWORD "$console-dev")"

# A JSON string literal. Values with control characters are refused before any is used (neither
# a prefix nor a password needs them, and JSON would need them escaped).
json() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "$s"
}

[[ -n "$prefix" ]] || die "empty PREFIX_REGEX"
for value in "$prefix" "$worker_password" "$client_password" "$monitor_password" "$console_password"; do
  if [[ "$value" =~ [[:cntrl:]] ]]; then die "control character in PREFIX_REGEX or a password"; fi
done
if [[ "$prefix" =~ ^[A-Za-z0-9_-]+$ ]]; then
  name="$prefix"
else
  name="aptix-any"
fi
# An alternation must not leak out of the anchors.
p="$prefix"
[[ "$p" == *"|"* ]] && p="(?:$p)"

if $print; then
  worker_password="***" client_password="***" monitor_password="***" console_password="***"
fi

all="^$p\\..*"
replies="^$p\\.(session|instance)\\..*"
# `delivery-limit`: only quorum queues read it. Every look at a dead letter (`aptix dead list`,
# the console) returns it to the queue, which RabbitMQ 4 counts as a delivery, and its quorum
# queues drop a message after 20 by default; -1 (no limit) is refused by 3.x, so a limit no look
# reaches.
bounded='{"max-length":100000,"max-length-bytes":1073741824,"message-ttl":1209600000,"delivery-limit":1000000000}'
# One tenant's dead letters or unrouted replies: its own queue, so its flood evicts only its own.
per_tenant='{"max-length":10000,"max-length-bytes":268435456,"message-ttl":1209600000,"delivery-limit":1000000000}'

shared_client=true
case "${APTIX_SHARED_CLIENT:-yes}" in
  yes) ;;
  no) shared_client=false ;;
  *) die "APTIX_SHARED_CLIENT must be yes or no" ;;
esac
client_user="" client_permissions=""
if $shared_client; then
  client_user=",
    {\"name\": $(json "$client"), \"password\": $(json "$client_password"), \"tags\": []}"
  client_permissions=",
    {\"user\": $(json "$client"), \"vhost\": \"/\", \"configure\": $(json "$replies"),
     \"write\": $(json "^$p\\.requests\$"), \"read\": $(json "$replies")}"
fi

definitions=$(
  cat <<EOF
{
  "users": [
    {"name": $(json "$worker"), "password": $(json "$worker_password"), "tags": ["management"]}$client_user,
    {"name": $(json "$monitor"), "password": $(json "$monitor_password"), "tags": ["management"]},
    {"name": $(json "$console"), "password": $(json "$console_password"), "tags": ["management"]}
  ],
  "permissions": [
    {"user": $(json "$worker"), "vhost": "/", "configure": $(json "$all"),
     "write": $(json "^($p\\..*|amq\\.default)\$"), "read": $(json "$all")}$client_permissions,
    {"user": $(json "$monitor"), "vhost": "/", "configure": "^\$", "write": "^\$", "read": "^\$"},
    {"user": $(json "$console"), "vhost": "/", "configure": "^\$",
     "write": $(json "^($p\\.requests|amq\\.default)\$"), "read": $(json "^$p\\.dead(\\.[a-z0-9_-]+)?\$")}
  ],
  "policies": [
    {"vhost": "/", "name": $(json "$name-sessions"), "pattern": $(json "^$p\\.session\\."),
     "apply-to": "queues", "priority": 0,
     "definition": {"expires": 86400000, "max-length": 10000, "overflow": "drop-head"}},
    {"vhost": "/", "name": $(json "$name-instances"), "pattern": $(json "^$p\\.instance\\."),
     "apply-to": "queues", "priority": 0,
     "definition": {"expires": 86400000, "max-length": 100000, "overflow": "drop-head"}},
    {"vhost": "/", "name": $(json "$name-dead"), "pattern": $(json "^$p\\.dead\$"),
     "apply-to": "queues", "priority": 0, "definition": $bounded},
    {"vhost": "/", "name": $(json "$name-unrouted"), "pattern": $(json "^$p\\.unrouted\$"),
     "apply-to": "queues", "priority": 0, "definition": $bounded},
    {"vhost": "/", "name": $(json "$name-dead-tenant"), "pattern": $(json "^$p\\.dead\\.[a-z0-9_-]+\$"),
     "apply-to": "queues", "priority": 0, "definition": $per_tenant},
    {"vhost": "/", "name": $(json "$name-unrouted-tenant"), "pattern": $(json "^$p\\.unrouted\\.[a-z0-9_-]+\$"),
     "apply-to": "queues", "priority": 0, "definition": $per_tenant}
  ]
}
EOF
)

if $print; then
  printf '%s\n' "$definitions"
  exit 0
fi

ctl=(rabbitmqctl -q)
[[ -n "${APTIX_RABBITMQ_NODE:-}" ]] && ctl+=(-n "$APTIX_RABBITMQ_NODE")
# From stdin (no file argument): the passwords never appear on a command line or in a file.
# rabbitmqctl waits for the import to finish, whatever its "asynchronous" message says.
printf '%s\n' "$definitions" | "${ctl[@]}" import_definitions >/dev/null
if ! $shared_client && "${ctl[@]}" list_users 2>/dev/null | grep -q "^$client\b"; then
  "${ctl[@]}" delete_user "$client" >/dev/null
  echo "setup.sh: deleted the shared user $client (APTIX_SHARED_CLIENT=no)"
fi
# The consistent-hash exchange spreads sessions over ingress partitions
# (amqp.ingress_partitions > 1). It ships with RabbitMQ. Enabled already (compose's
# enabled_plugins, the cluster operator's additionalPlugins), nothing is written: the operator's
# plugins file is read-only.
# The management API gives `aptix status` and the console their rates and each queue's workers
# (amqp.management_url), and KEDA its depths. Plugins are enabled per node, unlike users and
# policies: every running node of a cluster gets them (a worker connects to any node, and one
# without the exchange type cannot declare the partitions' exchanges).
nodes=()
if ! command -v python3 >/dev/null; then
  echo "setup.sh: no python3 to read the cluster's nodes: enabling the plugins on one node only" >&2
elif status=$("${ctl[@]}" cluster_status --formatter json 2>/dev/null); then
  mapfile -t nodes < <(printf '%s' "$status" | python3 -c \
    'import json, sys; print("\n".join(json.load(sys.stdin).get("running_nodes", [])))' 2>/dev/null)
fi
[[ ${#nodes[@]} -gt 0 && -n "${nodes[0]}" ]] || nodes=("${APTIX_RABBITMQ_NODE:-}")
plugins_missing=()
for node in "${nodes[@]}"; do
  plugins=(rabbitmq-plugins -q)
  [[ -n "$node" ]] && plugins+=(-n "$node")
  for plugin in rabbitmq_consistent_hash_exchange rabbitmq_management; do
    if ! "${plugins[@]}" is_enabled "$plugin" >/dev/null 2>&1 \
        && ! "${plugins[@]}" enable "$plugin" >/dev/null; then
      plugins_missing+=("$plugin on ${node:-the local node}")
    fi
  done
done
# Everything else is in place; a node whose plugins could not be enabled (unreachable from here,
# its configuration directory read-only) is named, and the script fails so that it is noticed.
if [[ ${#plugins_missing[@]} -gt 0 ]]; then
  printf 'setup.sh: could not enable %s: run `rabbitmq-plugins enable` there, or list it in that node'"'"'s enabled_plugins\n' \
    "${plugins_missing[@]}" >&2
  exit 1
fi
users="$worker, $client, $monitor and $console"
$shared_client || users="$worker, $monitor and $console"
$dev && echo "setup.sh: --dev: passwords not given are the development ones (never on a shared broker)"
echo "setup.sh: users $users, their permissions on / and the policies" \
  "$name-sessions, $name-instances, $name-dead, $name-unrouted, $name-dead-tenant, $name-unrouted-tenant are in place (prefix $prefix); plugins rabbitmq_consistent_hash_exchange and rabbitmq_management enabled"
