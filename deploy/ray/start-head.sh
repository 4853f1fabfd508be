#!/usr/bin/env bash
# Start the Ray head on the host that runs `emulator run` (the driver: it routes every round).
#
#   deploy/ray/start-head.sh [NUM_CPUS] [more `ray start` flags, e.g. --block]
#   RAY_PORT_OFFSET=100 deploy/ray/start-head.sh ...   # every port moved up (ports.sh), e.g. next to another Ray
#
# NUM_CPUS is how many shards this host takes (one core each); the default leaves one core to the
# driver. Every port is fixed so that a firewall can let exactly these through (the README (Run on Ray),
# "Run on four hosts"); a flag given after NUM_CPUS overrides the one here (the last one wins).
# The node runs detached and the script returns once it has started; stop-node.sh (with the same
# RAY_PORT_OFFSET) stops this node and nothing else. With --block it runs in the foreground instead.
set -euo pipefail
# shellcheck source=ports.sh
source "$(dirname "$0")/ports.sh"
cpus=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))
if [[ $# -gt 0 && "$1" != -* ]]; then cpus="$1"; shift; fi
# Every connection to the cluster presents a shared token (~/.ray/auth_token): make it here once,
# then copy it to the other hosts and to any machine that submits jobs. RAY_AUTH_MODE=disabled
# on every host turns this off (a trusted, closed network only).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
if [[ "$RAY_AUTH_MODE" == token ]]; then ray get-auth-token --generate >/dev/null; fi
ray_start_node --head \
  --port="$RAY_GCS_PORT" \
  --num-cpus="$cpus" \
  --dashboard-host=0.0.0.0 --dashboard-port="$RAY_DASHBOARD_PORT" \
  --ray-client-server-port="$RAY_CLIENT_PORT" \
  "${RAY_NODE_PORT_FLAGS[@]}" \
  "$@"
echo "head: --address $(hostname -I 2>/dev/null | awk '{print $1}'):$RAY_GCS_PORT (emulator run, start-worker.sh)," \
  "jobs: ray job submit --address http://127.0.0.1:$RAY_DASHBOARD_PORT"
