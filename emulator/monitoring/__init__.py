"""Live monitoring of a run: Prometheus exporter, terminal progress (see the README (Watch it in Grafana)).

    emulator run configs/examples/data-parallel.yaml --metrics-port 9431

Sits at the edge: the engine only calls an observer; nothing in ``emulator/engine`` or ``netmodel``
imports this package or ``prometheus_client``.
"""

from emulator.monitoring.live import LiveState, Snapshot
from emulator.monitoring.monitor import Monitor, expected_iterations

__all__ = ["LiveState", "Monitor", "Snapshot", "expected_iterations"]
