#!/usr/bin/env bash
# Creates or updates the RabbitMQ user of one Aptix tenant and its permissions on the vhost `/`,
# on the node this machine's `rabbitmqctl` reaches (docs/tenancy.md). Idempotent: run it again
# after a password change. The user and its permissions go in one `rabbitmqctl
# import_definitions` read from stdin, so the password never appears on a command line.
#
#   deploy/rabbitmq/add-tenant.sh [--delete] TENANT [PREFIX]
#
# TENANT    the tenant's name, as in `[tenants.TENANT]`: 1-32 of [a-z0-9_-], starting with a
#           letter or digit. It is a segment of the tenant's reply queue names.
# PREFIX    the queue-name prefix (`amqp.prefix`), a plain name (letters, digits, `.`, `_`, `-`;
#           default `aptix`), not a regular expression: its dots are escaped here.
# --delete  deletes the user (its permissions go with it) and closes its open connections.
#           Takes no password.
#
# Environment:
#   APTIX_TENANT_USER           the user's name; default `aptix-tenant-TENANT`. List it in the
#                               tenant's `users` (several during a password rotation).
#   APTIX_TENANT_PASSWORD       its password. Required unless the next one is set: no default.
#   APTIX_TENANT_PASSWORD_FILE  a file holding it instead (trailing newlines dropped; a mounted
#                               Secret)
#   APTIX_RABBITMQ_NODE         node to manage (rabbitmqctl -n), when not the local default
#
# The permissions, with T the tenant and P the prefix (docs/client-protocol.md §4b):
#   configure  ^P\.(session|instance)\.T\..*  declare and delete its own reply queues
#   write      ^P\.requests$                  the entry exchange only (not the default exchange,
#                                             not P.replies, no other tenant's queue)
#   read       ^P\.(session|instance)\.T\..*  consume its own reply queues
# RabbitMQ answers any other tenant's queue with 403 ACCESS_REFUSED. The user gets no tags, and
# any it had are removed: never `impersonator`, which would let it publish under another user's
# `user_id`, the property that tells tenants apart. User limits (`set_user_limits`) are kept.
set -euo pipefail

delete=false
if [[ "${1:-}" == "--delete" ]]; then
  delete=true
  shift
fi
if (($# < 1 || $# > 2)); then
  echo "usage: $0 [--delete] TENANT [PREFIX]" >&2
  exit 2
fi
tenant="$1"
prefix="${2:-aptix}"
user="${APTIX_TENANT_USER:-aptix-tenant-$tenant}"

die() {
  echo "add-tenant.sh: $*" >&2
  exit 1
}

[[ "$tenant" =~ ^[a-z0-9][a-z0-9_-]{0,31}$ ]] ||
  die "\`$tenant\` is not a tenant name: use 1-32 lowercase letters, digits, \`_\` or \`-\`, starting with a letter or digit"
[[ "$prefix" =~ ^[A-Za-z0-9._-]+$ ]] ||
  die "\`$prefix\` is not a prefix: use letters, digits, \`.\`, \`_\` or \`-\` (amqp.prefix)"
[[ -n "$user" ]] || die "empty APTIX_TENANT_USER"
if [[ "$user" =~ [[:cntrl:]] ]]; then die "control character in APTIX_TENANT_USER"; fi

ctl=(rabbitmqctl -q)
[[ -n "${APTIX_RABBITMQ_NODE:-}" ]] && ctl+=(-n "$APTIX_RABBITMQ_NODE")

if $delete; then
  # Deleting the user first keeps it from reconnecting. RabbitMQ 3.10 closes the user's open
  # connections itself (CONNECTION_FORCED); closing them next covers a broker that does not.
  # Exit code 67: no such user, nothing to do.
  status=0
  # stdin from /dev/null: with `bash -s` the rest of this script is on stdin.
  err="$("${ctl[@]}" delete_user "$user" 2>&1 >/dev/null </dev/null)" || status=$?
  if ((status == 67)); then
    echo "add-tenant.sh: there is no user $user (tenant $tenant); nothing deleted"
    exit 0
  fi
  ((status == 0)) || die "rabbitmqctl delete_user $user failed: $err"
  "${ctl[@]}" close_all_user_connections "$user" "tenant $tenant removed" >/dev/null </dev/null
  echo "add-tenant.sh: user $user (tenant $tenant) deleted with its permissions; its connections closed"
  exit 0
fi

# The password from APTIX_TENANT_PASSWORD_FILE (trailing newlines dropped), else
# APTIX_TENANT_PASSWORD.
if [[ -n "${APTIX_TENANT_PASSWORD_FILE:-}" ]]; then
  [[ -r "$APTIX_TENANT_PASSWORD_FILE" ]] ||
    die "APTIX_TENANT_PASSWORD_FILE: cannot read $APTIX_TENANT_PASSWORD_FILE"
  password="$(<"$APTIX_TENANT_PASSWORD_FILE")"
elif [[ -n "${APTIX_TENANT_PASSWORD:-}" ]]; then
  password="$APTIX_TENANT_PASSWORD"
else
  die "set APTIX_TENANT_PASSWORD or APTIX_TENANT_PASSWORD_FILE: a tenant user has no default password"
fi
[[ -n "$password" ]] || die "empty password"
if [[ "$password" =~ [[:cntrl:]] ]]; then die "control character in the password"; fi

# A JSON string literal (control characters were refused above).
json() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "$s"
}

p="${prefix//./\\.}"
own="^$p\\.(session|instance)\\.$tenant\\..*"
entry="^$p\\.requests\$"

definitions=$(
  cat <<EOF
{
  "users": [
    {"name": $(json "$user"), "password": $(json "$password"), "tags": []}
  ],
  "permissions": [
    {"user": $(json "$user"), "vhost": "/", "configure": $(json "$own"),
     "write": $(json "$entry"), "read": $(json "$own")}
  ]
}
EOF
)

# From stdin (no file argument): the password never appears on a command line or in a file.
printf '%s\n' "$definitions" | "${ctl[@]}" import_definitions >/dev/null
echo "add-tenant.sh: user $user (tenant $tenant, no tags) is in place with its password;" \
  "on / it may configure and read $own, write $entry (prefix $prefix)"
