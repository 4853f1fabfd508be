# The fixed ports every Ray node of the emulator uses (sourced by start-head.sh and start-worker.sh),
# so that a firewall can let exactly these through: the README (Run on Ray), "Run on four hosts".
RAY_NODE_PORT_FLAGS=(
  --node-manager-port=6380 --object-manager-port=6381
  --runtime-env-agent-port=6382 --dashboard-agent-grpc-port=6383 --dashboard-agent-listen-port=52365
  --metrics-export-port=8090
  --min-worker-port=10002 --max-worker-port=10999
  --disable-usage-stats
)
