# The fixed ports of one Ray node of the emulator, and where the node keeps its files (sourced by
# start-head.sh, start-worker.sh and stop-node.sh), so that a firewall can let exactly these through:
# the README (Run on Ray), "Run on four hosts".
#
# RAY_PORT_OFFSET=N (default 0; a multiple of 100, at most 900) moves every port of the node up by
# N and its worker port range up by 10 N, so that several nodes can run on one machine (the README,
# "Try it on one machine"): offsets 0, 100, 200 and 300 give four nodes whose ports never collide.
#
#   offset 0:   GCS 6379 (head), node 6380-6383, dashboard 8265 (head), metrics 8090, agent 52365,
#               Ray Client 10001 (head), workers 10002-10999
#   offset 100: GCS 6479 (head), node 6480-6483, dashboard 8365 (head), metrics 8190, agent 52465,
#               Ray Client 11001 (head), workers 11002-11999
#
# A node with a non-zero offset also keeps its own temporary directory (RAY_NODE_TEMP_DIR), because
# nodes on one machine must not share one: each node's runtime-environment agent deletes and unpacks
# a `ray job submit --working-dir` copy again the first time it sees it, under the processes of the
# other nodes that already run from that copy.
RAY_PORT_OFFSET="${RAY_PORT_OFFSET:-0}"
if ! [[ "$RAY_PORT_OFFSET" =~ ^[0-9]+$ ]] || (( RAY_PORT_OFFSET % 100 != 0 || RAY_PORT_OFFSET > 900 )); then
  echo "error: RAY_PORT_OFFSET=$RAY_PORT_OFFSET: expected a multiple of 100 from 0 to 900" >&2
  exit 2
fi
# Ray starts its worker processes at niceness 15 by default, so a shard (a worker) loses its core to
# any other process of the host, Ray's own daemons included; the shards are the job: normal priority.
export RAY_worker_niceness="${RAY_worker_niceness:-0}"
ray_port() { echo $(( $1 + RAY_PORT_OFFSET )); }
RAY_GCS_PORT=$(ray_port 6379)
RAY_DASHBOARD_PORT=$(ray_port 8265)
RAY_CLIENT_PORT=$(( 10001 + 10 * RAY_PORT_OFFSET ))
RAY_NODE_MANAGER_PORT=$(ray_port 6380)
RAY_NODE_PORT_FLAGS=(
  --node-manager-port="$RAY_NODE_MANAGER_PORT" --object-manager-port="$(ray_port 6381)"
  --runtime-env-agent-port="$(ray_port 6382)" --dashboard-agent-grpc-port="$(ray_port 6383)"
  --dashboard-agent-listen-port="$(ray_port 52365)"
  --metrics-export-port="$(ray_port 8090)"
  --min-worker-port=$(( 10002 + 10 * RAY_PORT_OFFSET )) --max-worker-port=$(( 10999 + 10 * RAY_PORT_OFFSET ))
  --disable-usage-stats
)
# Ray's own default (/tmp/ray) for offset 0; a directory of its own for every other offset.
if [[ -z "${RAY_NODE_TEMP_DIR:-}" && "$RAY_PORT_OFFSET" != 0 ]]; then
  RAY_NODE_TEMP_DIR="${TMPDIR:-/tmp}/ray-node-$RAY_PORT_OFFSET"
fi
if [[ -n "${RAY_NODE_TEMP_DIR:-}" ]]; then RAY_NODE_PORT_FLAGS+=(--temp-dir="$RAY_NODE_TEMP_DIR"); fi
# The node's `ray start --block` process (the parent of all its processes: stop-node.sh stops it by
# this PID) and its log, named by the node-manager port, which is unique among the nodes of a host.
RAY_NODE_PID_FILE="${TMPDIR:-/tmp}/emulator-ray-node-$RAY_NODE_MANAGER_PORT.pid"
RAY_NODE_LOG_FILE="${TMPDIR:-/tmp}/emulator-ray-node-$RAY_NODE_MANAGER_PORT.log"

# Whether PID is this node's `ray start` (and not a process that reused the number since).
ray_node_running() {
  local cmd
  cmd=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
  [[ "$cmd" == *"ray start --block "*"--node-manager-port=$RAY_NODE_MANAGER_PORT "* ]]
}

# Run `ray start --block "$@"` as this node's process: in the foreground where the caller passed
# --block (systemd, for instance), otherwise detached (its own session, so that closing the shell
# leaves it running) with its PID in RAY_NODE_PID_FILE, returning once the node has started.
ray_start_node() {
  local arg
  for arg in "$@"; do
    if [[ "$arg" == --block ]]; then exec ray start "$@"; fi
  done
  if [[ -s "$RAY_NODE_PID_FILE" ]] && ray_node_running "$(cat "$RAY_NODE_PID_FILE")"; then
    echo "error: a Ray node with node-manager port $RAY_NODE_MANAGER_PORT already runs here (PID $(cat "$RAY_NODE_PID_FILE")):" \
      "stop it with RAY_PORT_OFFSET=$RAY_PORT_OFFSET deploy/ray/stop-node.sh, or pick another RAY_PORT_OFFSET" >&2
    exit 2
  fi
  setsid nohup ray start --block "$@" </dev/null >"$RAY_NODE_LOG_FILE" 2>&1 &
  local pid=$!
  echo "$pid" >"$RAY_NODE_PID_FILE"
  local waited=0
  until grep -q "Ray runtime started" "$RAY_NODE_LOG_FILE" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || (( waited >= ${RAY_START_TIMEOUT_S:-180} )); then
      echo "error: the Ray node did not start (log: $RAY_NODE_LOG_FILE):" >&2
      { grep -v '^ ' "$RAY_NODE_LOG_FILE" | tail -n 5 >&2; } || true
      kill -TERM "$pid" 2>/dev/null || true
      rm -f "$RAY_NODE_PID_FILE"
      exit 1
    fi
    sleep 1
    waited=$(( waited + 1 ))
  done
  echo "Ray node started: PID $pid, node-manager port $RAY_NODE_MANAGER_PORT, log $RAY_NODE_LOG_FILE"
  echo "stop this node (only this one): RAY_PORT_OFFSET=$RAY_PORT_OFFSET $(dirname "$0")/stop-node.sh"
}
