#!/usr/bin/env bash
# Join this host to the Ray cluster whose head runs at HEAD_IP (port 6379 unless given).
#
#   deploy/ray/start-worker.sh HEAD_IP[:PORT] [NUM_CPUS] [more `ray start` flags, e.g. --block]
#   RAY_PORT_OFFSET=100 deploy/ray/start-worker.sh ...   # this node's ports moved up (ports.sh): a second node here
#
# NUM_CPUS is how many shards this host takes (one core each; default: all its cores). The ports
# are those of start-head.sh: open them between all hosts (the README (Run on Ray), "Run on four hosts").
# The node runs detached and the script returns once it has started; stop-node.sh (with the same
# RAY_PORT_OFFSET) stops this node and nothing else. With --block it runs in the foreground instead.
set -euo pipefail
# shellcheck source=ports.sh
source "$(dirname "$0")/ports.sh"
head="${1:?usage: start-worker.sh HEAD_IP[:PORT] [NUM_CPUS] [ray start flags]}"
[[ "$head" == *:* ]] || head="$head:6379"
shift
cpus=$(nproc)
if [[ $# -gt 0 && "$1" != -* ]]; then cpus="$1"; shift; fi
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"  # as on the head (start-head.sh)
if [[ "$RAY_AUTH_MODE" == token && -z "${RAY_AUTH_TOKEN:-}" && ! -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]]; then
  echo "error: no Ray token on this host: copy it from the head (scp HEAD_IP:.ray/auth_token ~/.ray/auth_token)" >&2
  exit 2
fi
# `ray start` retries an address that nobody answers on for minutes: fail in seconds instead
if ! timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2"' reach "${head%:*}" "${head##*:}" 2>/dev/null; then
  echo "error: nothing answers at $head: start the head first (start-head.sh), or check the address and firewall" >&2
  exit 2
fi
ray_start_node --address="$head" \
  --num-cpus="$cpus" \
  "${RAY_NODE_PORT_FLAGS[@]}" \
  "$@"
