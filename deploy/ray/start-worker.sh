#!/usr/bin/env bash
# Join this host to the Ray cluster whose head runs at HEAD_IP (port 6379 unless given).
#
#   deploy/ray/start-worker.sh HEAD_IP[:PORT] [NUM_CPUS] [more `ray start` flags, e.g. --block]
#
# NUM_CPUS is how many shards this host takes (one core each; default: all its cores). The ports
# are those of start-head.sh: open them between all hosts (the README (Run on Ray), "Run on four hosts").
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
exec ray start --address="$head" \
  --num-cpus="$cpus" \
  "${RAY_NODE_PORT_FLAGS[@]}" \
  "$@"
