#!/usr/bin/env bash
# Stop the Ray node that start-head.sh or start-worker.sh started on this host with the same
# RAY_PORT_OFFSET, and only that node: its `ray start` process (by the PID it recorded) drains the
# node and ends every process of it (raylet, agents, shard workers; on the head also GCS and
# dashboard). Unlike Ray's own stop command, which stops every Ray process of the host, whoever started it.
#
#   deploy/ray/stop-node.sh                         # the node of offset 0
#   RAY_PORT_OFFSET=100 deploy/ray/stop-node.sh     # the node of offset 100
set -euo pipefail
# shellcheck source=ports.sh
source "$(dirname "$0")/ports.sh"
if [[ ! -s "$RAY_NODE_PID_FILE" ]]; then
  echo "error: no Ray node of offset $RAY_PORT_OFFSET was started here by deploy/ray ($RAY_NODE_PID_FILE is missing)" >&2
  exit 2
fi
pid=$(cat "$RAY_NODE_PID_FILE")
if ! ray_node_running "$pid"; then  # gone already, or the number now belongs to another process
  echo "Ray node of offset $RAY_PORT_OFFSET (PID $pid) is not running"
  rm -f "$RAY_NODE_PID_FILE"
  exit 0
fi
kill -TERM "$pid"
# done when no process of the node's own process group (started with setsid: its ID is $pid) is left
for _ in $(seq 1 "${RAY_STOP_TIMEOUT_S:-60}"); do
  if ! kill -0 -- "-$pid" 2>/dev/null; then
    rm -f "$RAY_NODE_PID_FILE"
    echo "stopped the Ray node of offset $RAY_PORT_OFFSET (PID $pid)"
    exit 0
  fi
  sleep 1
done
echo "error: processes of the Ray node of offset $RAY_PORT_OFFSET (process group $pid) still run after" \
  "${RAY_STOP_TIMEOUT_S:-60} s: $(ps -eo pid=,pgid= | awk -v g="$pid" '$2 == g {print $1}' | xargs) (kill -KILL -- -$pid ends them)" >&2
exit 1
