#!/usr/bin/env bash
# A throwaway 3-node RabbitMQ 3.10 cluster on this one machine, beside the service node
# rabbit@localhost (127.0.0.1:5672), for failover tests (kill a quorum queue's leader, check no loss).
#
#   rabbitmq-cluster.sh start              3 fresh nodes, clustered; prints one AMQP URL per node
#   rabbitmq-cluster.sh kill N             SIGKILL node N (1..3); returns once the process is gone
#   rabbitmq-cluster.sh restart N          start node N again (it keeps its data and rejoins)
#   rabbitmq-cluster.sh leader QUEUE       print the number of the node leading quorum queue QUEUE
#   rabbitmq-cluster.sh wait-synced QUEUE  wait until the 3 members of QUEUE hold the same log
#                                          (call it with no publishing going on)
#   rabbitmq-cluster.sh ctl ARGS...        rabbitmqctl ARGS against a live node of this cluster
#   rabbitmq-cluster.sh stop               stop every node (SIGTERM, SIGKILL after 30 s), rm the dir
# Only `start` writes to stdout (the URLs), besides the answers of `leader` and `ctl`; logs go to
# stderr. Every failure exits non-zero with a message; a failed `start` leaves no process running.
#
# Environment:
#   APTIX_CLUSTER_DIR       all state (default /tmp/aptix-cluster): HOME with the cluster's own
#                           .erlang.cookie, per node nN/{mnesia,log,rabbitmq.conf,enabled_plugins,pid}
#   APTIX_CLUSTER_PORT_BASE (default 5701) AMQP on 127.0.0.1:BASE..BASE+2 for n1..n3; Erlang
#                           distribution on BASE+20000..+2, this cluster's own epmd on BASE+20009,
#                           CLI distribution on BASE+20010..+19: all clear of 4369/5672/25672/35672+
#   APTIX_CLUSTER_TIMEOUT   seconds allowed for each wait (boot, kill, leader, sync; default 120)
#
# Isolation from the service node (which must not be touched): the nodes are aptix-nN@localhost,
# share a cookie the service node does not have (own HOME), and register with an epmd of their own
# (ERL_EPMD_PORT; ERL_EPMD_ADDRESS=127.0.0.1), so the shared epmd on 4369 is neither used nor
# killed. RABBITMQ_CONF_ENV_FILE / CONFIG_FILE(S) / ADVANCED_CONFIG_FILE point into our directory,
# so /etc/rabbitmq (NODENAME=rabbit@localhost, listener 5672) does not leak in. The programs under
# /usr/lib/rabbitmq/bin are used: the /usr/sbin wrappers switch to the rabbitmq user and its cookie.
# Processes are only ever signalled after /proc/PID/environ shows the marker this script gave them.
# shellcheck disable=SC2015,SC2030,SC2031  # `a && b || die` and exports in subshells are meant

set -euo pipefail

BASE=${APTIX_CLUSTER_DIR:-/tmp/aptix-cluster}
PORT_BASE=${APTIX_CLUSTER_PORT_BASE:-5701}
TIMEOUT=${APTIX_CLUSTER_TIMEOUT:-120}
EPMD_PORT=$((PORT_BASE + 20009))
RMQ_BIN=/usr/lib/rabbitmq/bin
NODES=(1 2 3)

log() { printf '[cluster %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
node_name() { echo "aptix-n$1@localhost"; }
check_n() { [[ ${1:-} =~ ^[123]$ ]] || die "node number must be 1, 2 or 3, got '${1:-}'"; }

# Environment shared by the nodes and the CLI: cookie (HOME), epmd, no /etc/rabbitmq.
common_env() {
  export HOME="$BASE/home" ERL_EPMD_PORT="$EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1 \
    ERL_FLAGS='-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}' \
    RABBITMQ_CONF_ENV_FILE="$BASE/rabbitmq-env.conf" \
    RABBITMQ_CTL_DIST_PORT_MIN=$((PORT_BASE + 20010)) RABBITMQ_CTL_DIST_PORT_MAX=$((PORT_BASE + 20019))
}
# Per-node environment (what the measured recipe needs to keep three nodes apart).
node_env() {
  local d="$BASE/n$1"
  common_env
  export RABBITMQ_NODENAME="aptix-n$1@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$((PORT_BASE + $1 - 1)) RABBITMQ_DIST_PORT=$((PORT_BASE + 20000 + $1 - 1)) \
    RABBITMQ_MNESIA_BASE="$d/mnesia" RABBITMQ_LOG_BASE="$d/log" \
    RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf" RABBITMQ_CONFIG_FILES="$d/conf.d/*.conf" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins" RABBITMQ_PID_FILE="$d/pid"
}

# pid_of MARKER PIDFILE...: print the pid from the first file naming a live process of ours.
pid_of() {
  local marker=$1 f pid; shift
  for f in "$@"; do
    pid=$(cat "$f" 2>/dev/null) || continue
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/environ ]] || continue
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || continue # zombie = gone
    if grep -qzxF "APTIX_CLUSTER_PROC=$marker" "/proc/$pid/environ" 2>/dev/null; then
      echo "$pid"; return 0
    fi
  done
  return 1
}
node_pid() { pid_of "$BASE/n$1" "$BASE/n$1/pid" "$BASE/n$1/launcher.pid"; }
listening() { [[ -n $(ss -Hltn "sport = :$1") ]]; }  # no `| grep -q`: SIGPIPE + pipefail
# live_node: first node whose process runs and whose AMQP listener is open (i.e. done booting).
live_node() {
  local i; for i in "${NODES[@]}"; do
    node_pid "$i" >/dev/null && listening $((PORT_BASE + i - 1)) && { echo "$i"; return 0; }
  done; return 1
}

# wait_gone PID SECONDS: wait until PID has exited (or is a zombie); 1 on timeout.
wait_gone() {
  local end=$((SECONDS + $2))
  while [[ -d /proc/$1 && $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]; do
    ((SECONDS < end)) || return 1; sleep 0.1
  done
}

# rmq N PROGRAM ARGS...: a CLI program against node N, with this cluster's cookie and epmd.
rmq() { local i=$1 p=$2; shift 2; (node_env "$i"; exec "$RMQ_BIN/$p" -n "$(node_name "$i")" "$@"); }

# Start the cluster's epmd (foreground process in the background, so we know its pid).
start_epmd() {
  pid_of "$BASE/epmd" "$BASE/epmd.pid" >/dev/null && return 0
  (common_env; export APTIX_CLUSTER_PROC="$BASE/epmd"
   exec setsid epmd -port "$EPMD_PORT" -address 127.0.0.1 </dev/null >>"$BASE/epmd.log" 2>&1) &
  echo $! >"$BASE/epmd.pid"
  local end=$((SECONDS + 10))
  until listening "$EPMD_PORT"; do
    ((SECONDS < end)) || die "epmd did not listen on 127.0.0.1:$EPMD_PORT (see $BASE/epmd.log)"; sleep 0.1
  done
}

# Launch node N detached (own session, no inherited stdio: a caller reading our stdout to EOF
# must not wait for the nodes).
launch() {
  local d="$BASE/n$1"
  (node_env "$1"; export APTIX_CLUSTER_PROC="$d"; cd "$d"
   exec setsid "$RMQ_BIN/rabbitmq-server" </dev/null >>"$d/log/console.log" 2>&1) &
  echo $! >"$d/launcher.pid"
}

# wait_up N DEADLINE: AMQP listener open, then await_startup; fails early if the node died.
wait_up() {
  local i=$1 end=$2 port=$((PORT_BASE + $1 - 1))
  until listening "$port"; do
    node_pid "$i" >/dev/null || { tail -n 25 "$BASE/n$i/log/"*.log >&2 || true; die "node n$i exited during boot (logs: $BASE/n$i/log)"; }
    ((SECONDS < end)) || die "node n$i not listening on $port after ${TIMEOUT}s (logs: $BASE/n$i/log)"
    sleep 0.3
  done
  rmq "$i" rabbitmqctl -q await_startup --timeout $((end > SECONDS ? end - SECONDS : 1)) >&2 \
    || die "node n$i: await_startup failed (logs: $BASE/n$i/log)"
}

# Kill every process of this cluster (TERM, then KILL after 30 s). Keeps the directory.
teardown() {
  local i pid pids=() end=$((SECONDS + 30))
  for i in "${NODES[@]}"; do pid=$(node_pid "$i") && pids+=("$pid"); done
  ((${#pids[@]})) && { log "stopping pids ${pids[*]}"; kill -TERM "${pids[@]}" 2>/dev/null || true; }
  for pid in "${pids[@]}"; do
    wait_gone "$pid" $((end > SECONDS ? end - SECONDS : 0)) || { log "pid $pid ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; wait_gone "$pid" 10 || true; }
  done
  if pid=$(pid_of "$BASE/epmd" "$BASE/epmd.pid"); then kill -TERM "$pid" 2>/dev/null || true; wait_gone "$pid" 5 || kill -KILL "$pid" 2>/dev/null || true; fi
}

cmd_stop() { [[ -d $BASE ]] || return 0; teardown; rm -rf -- "$BASE"; log "stopped, removed $BASE"; }

cmd_start() {
  [[ -d $BASE ]] && { log "$BASE exists: stopping the old cluster first"; cmd_stop; }
  local i p t0=$SECONDS end=$((SECONDS + TIMEOUT))
  for p in "$EPMD_PORT" $((PORT_BASE)) $((PORT_BASE + 1)) $((PORT_BASE + 2)) $((PORT_BASE + 20000)) $((PORT_BASE + 20001)) $((PORT_BASE + 20002)); do
    ! listening "$p" || die "port $p is already in use: pick another APTIX_CLUSTER_PORT_BASE"
  done
  trap 'teardown; log "start failed: no node left running; logs kept in $BASE (\`stop\` removes them)"' EXIT
  mkdir -p "$BASE/home"
  od -An -N16 -tx1 /dev/urandom | tr -d ' \n' | tr a-f A-F >"$BASE/home/.erlang.cookie"
  chmod 400 "$BASE/home/.erlang.cookie"
  echo '# empty on purpose: keeps /etc/rabbitmq/rabbitmq-env.conf (the service node) out' >"$BASE/rabbitmq-env.conf"
  for i in "${NODES[@]}"; do
    mkdir -p "$BASE/n$i/log" "$BASE/n$i/mnesia"
    printf '%s\n' "listeners.tcp.default = 127.0.0.1:$((PORT_BASE + i - 1))" \
      'max_message_size = 16777216' 'log.console = false' 'log.file.level = info' >"$BASE/n$i/rabbitmq.conf"
    echo '[rabbitmq_consistent_hash_exchange].' >"$BASE/n$i/enabled_plugins"
  done
  start_epmd
  for i in "${NODES[@]}"; do launch "$i"; done
  for i in "${NODES[@]}"; do wait_up "$i" "$end"; done
  log "3 nodes up after $((SECONDS - t0))s; joining n2, n3 to n1"
  local t1=$SECONDS
  for i in 2 3; do  # one at a time: two concurrent joins abort each other's mnesia schema change
    rmq "$i" rabbitmqctl -q stop_app >&2 && rmq "$i" rabbitmqctl -q join_cluster "$(node_name 1)" >&2 &&
      rmq "$i" rabbitmqctl -q start_app >&2 || die "n$i could not join n1 (logs: $BASE/n$i/log)"
  done
  # Wait for the joins to be visible (both joiners running, as seen from n1).
  local n=0
  until n=$(rmq 1 rabbitmqctl -q eval 'length(rabbit_nodes:all_running()).' 2>/dev/null) && [[ $n == 3 ]]; do
    ((SECONDS < end)) || die "cluster did not reach 3 running nodes (last: '$n')"; sleep 0.5
  done
  log "cluster formed in $((SECONDS - t1))s (total $((SECONDS - t0))s)"
  trap - EXIT
  for i in "${NODES[@]}"; do echo "amqp://guest:guest@127.0.0.1:$((PORT_BASE + i - 1))/%2f"; done
}

cmd_kill() {
  check_n "${1:-}"; local pid
  pid=$(node_pid "$1") || die "node n$1 is not running"
  kill -KILL "$pid"; wait_gone "$pid" "$TIMEOUT" || die "node n$1 (pid $pid) still there after SIGKILL"
  log "killed n$1 (pid $pid)"
}

cmd_restart() {
  check_n "${1:-}"; [[ -d $BASE/n$1/mnesia ]] || die "no cluster in $BASE: run start first"
  local t0=$SECONDS
  if ! node_pid "$1" >/dev/null; then start_epmd; launch "$1"; fi
  trap 'if pid=$(node_pid '"$1"'); then kill -KILL "$pid"; fi' EXIT
  wait_up "$1" $((SECONDS + TIMEOUT)); trap - EXIT
  log "n$1 up after $((SECONDS - t0))s"
}

# quorum_status QUEUE: "node raft_state log_index commit_index" per member, asked of a live node.
# Relies on 3.10's JSON: [{"Node Name":..,"Raft State":"leader"|"follower"|..,"Log Index":N,
# "Commit Index":N,..}]; an unreachable member has "Raft State":["nodedown",Node] and "" indices.
# Status 1: try again (no live node, no answer yet); 2: no such quorum queue, give up.
quorum_status() {
  local i out; i=$(live_node) || return 1
  out=$(rmq "$i" rabbitmq-queues -q quorum_status --vhost / "$1" --formatter json 2>&1) || {
    [[ $out == *not_found* || $out == *"classic queue"* ]] && { log "queue '$1': $(tr '\n' ' ' <<<"$out")"; return 2; }
    return 1; }
  python3 -c '
import json, sys
try: ms = json.load(sys.stdin)
except ValueError: sys.exit(1)  # an error message instead of JSON (e.g. no quorum)
for m in ms:
    f = [m.get(k) for k in ("Node Name", "Raft State", "Log Index", "Commit Index")]
    print(" ".join("-".join(map(str, v)) if isinstance(v, list) else str(v if v != "" else "-") for v in f))' <<<"$out"
}

cmd_leader() {
  [[ -n ${1:-} ]] || die "usage: leader QUEUE"
  local end=$((SECONDS + TIMEOUT)) st leader
  while :; do  # right after a kill there is no leader until the election is over
    st=$(quorum_status "$1") || { (($? == 2)) && exit 1; st=''; }
    leader=$(awk '$2 == "leader" {print $1}' <<<"$st")
    [[ $(wc -w <<<"$leader") == 1 && $leader =~ ^aptix-n([123])@ ]] && { echo "${BASH_REMATCH[1]}"; return 0; }
    ((SECONDS < end)) || die "no single leader for queue '$1' after ${TIMEOUT}s: ${st:-no status}"
    sleep 0.2
  done
}

cmd_wait_synced() {
  [[ -n ${1:-} ]] || die "usage: wait-synced QUEUE"
  local end=$((SECONDS + TIMEOUT)) st
  while :; do  # 3 members, 1 leader + 2 followers, one log index and one commit index between them
    st=$(quorum_status "$1") || { (($? == 2)) && exit 1; st=''; }
    if [[ $(awk '$2=="leader"{l++} $2=="follower"{f++} !($3 in li){li[$3]; nl++} !($4 in ci){ci[$4]; nc++}
            END{print (NR==3 && l==1 && f==2 && nl==1 && nc==1) ? "ok" : "no"}' <<<"$st") == ok ]]; then
      log "queue '$1' in sync: $(tr '\n' ';' <<<"$st")"; return 0
    fi
    ((SECONDS < end)) || die "queue '$1' not in sync after ${TIMEOUT}s: $(tr '\n' ';' <<<"$st")"
    sleep 0.5
  done
}

cmd_ctl() { local i; i=$(live_node) || die "no node of the cluster is running"; rmq "$i" rabbitmqctl "$@"; }

trap 'exit 130' INT TERM
case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  kill) cmd_kill "${2:-}" ;;
  restart) cmd_restart "${2:-}" ;;
  leader) cmd_leader "${2:-}" ;;
  wait-synced) cmd_wait_synced "${2:-}" ;;
  ctl) shift; cmd_ctl "$@" ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
