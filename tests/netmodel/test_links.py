"""The link model (netmodel/links.py): closed-form transfer times across slow-link windows, FIFO
reservation, and netmodel standing alone below the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from netmodel.errors import ConfigError
from netmodel.links import NO_END_NS, LinkModel
from netmodel.spec import ClusterConfig, NicConfig, SwitchTierConfig
from netmodel.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
BW = 25.0  # bytes per ns: a 200 Gb/s NIC at full efficiency
SIZE = 25_000_000  # 1 ms at BW
LATENCY_NS = 5_000


def _topology(*slow_links) -> Topology:
    """Two nodes of one GPU and one 200 Gb/s NIC under one leaf; ``slow_links``: (factor, start_s,
    end_s) entries on node 0's NIC."""
    cluster = ClusterConfig(nodes=2, gpus_per_node=1, nic=NicConfig(bandwidth_Gbps=200),
                            tiers=[SwitchTierConfig(name="leaf", latency_us=LATENCY_NS / 1000)])  # fmt: skip
    entries = [SimpleNamespace(links=None, nic=SimpleNamespace(node=0, index=0), tier=None, factor=factor,
                               start_s=start, end_s=end) for factor, start, end in slow_links]  # fmt: skip
    cluster.faults = SimpleNamespace(slow_link=entries)
    return Topology(cluster)


def _send(topo: Topology, t: int = 0) -> tuple[LinkModel, int, int]:
    links = LinkModel(topo)
    start, end_up = links.send(topo.route(0, 1), SIZE, t)
    return links, start, end_up


def test_netmodel_imports_nothing_from_the_engine():
    """Every netmodel module imports with emulator, actors, ray and prometheus_client unimportable."""
    code = (
        "import importlib, pkgutil, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('emulator', 'actors', 'ray', 'prometheus_client'):\n"
        "            raise ImportError('netmodel imports ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import netmodel\n"
        "names = [m.name for m in pkgutil.walk_packages(netmodel.__path__, 'netmodel.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 14  # the modules are really walked (collectives included)


def test_nominal_transfer():
    topo = _topology()
    links, start, end_up = _send(topo)
    assert (start, end_up) == (0, 1_000_000)
    assert links.receive(topo.route(0, 1), SIZE, LATENCY_NS, end_up) == 1_000_000 + LATENCY_NS


def test_window_opening_mid_transfer_paces_the_rest():
    """Half speed from 0.5 ms: 12.5 MB leave in the first 0.5 ms, the other 12.5 MB at 12.5 B/ns
    take 1 ms; the NIC is busy 1.5 ms; delivery is the tail plus the latency (the receiver's NIC,
    at full speed, is not the slower side)."""
    topo = _topology((0.5, 0.0005, None))
    links, start, end_up = _send(topo)
    assert end_up == 1_500_000
    tx = topo.nic_tx[0][0]
    assert links.busy_ns[tx] == 1_500_000 and links.free_py[tx] == 1_500_000 and links.bytes[tx] == SIZE
    assert links.receive(topo.route(0, 1), SIZE, start + LATENCY_NS, end_up) == 1_500_000 + LATENCY_NS
    assert topo.link_bw[tx] == BW  # a window leaves the whole-run bandwidth alone


def test_window_closing_mid_transfer():
    """Half speed until 0.5 ms: 6.25 MB by then, 18.75 MB at 25 B/ns after: 1.25 ms."""
    assert _send(_topology((0.5, None, 0.0005)))[2] == 1_250_000


def test_overlapping_windows_multiply():
    """0.5 over [0, 1) ms and 0.5 over [0.2, 0.6) ms: 2.5 + 2.5 + 5 MB by 1 ms, then 15 MB at full
    speed (0.6 ms)."""
    assert _send(_topology((0.5, 0.0, 0.001), (0.5, 0.0002, 0.0006)))[2] == 1_600_000


def test_window_after_the_transfer_changes_nothing_and_a_later_send_queues():
    topo = _topology((0.25, 0.002, 0.003))
    links, _, end_up = _send(topo)
    assert end_up == 1_000_000
    # a second message queued behind the first starts at 1 ms and has left when the window opens
    start, end_up = links.send(topo.route(0, 1), SIZE, 0)
    assert (start, end_up) == (1_000_000, 2_000_000)
    # a third starts at 2 ms inside the window: 25 MB at 6.25 B/ns until 3 ms (6.25 MB), then 18.75 MB
    # at full speed (0.75 ms)
    assert links.send(topo.route(0, 1), SIZE, 0) == (2_000_000, 3_750_000)
    tx = topo.nic_tx[0][0]
    assert links.max_wait_ns[tx] == 2_000_000 and links.queued_messages[tx] == 2


def test_windowed_factor_below_the_floor_is_refused():
    """Factors of one link multiply, windows included: 0.01 x 0.01 of a 100 Mb/s share is too slow."""
    cluster = ClusterConfig(nodes=2, gpus_per_node=1, nic=NicConfig(bandwidth_Gbps=0.1, efficiency=0.05),
                            tiers=[SwitchTierConfig(name="leaf")])  # fmt: skip
    entry = dict(links=None, nic=SimpleNamespace(node=0, index=0), tier=None, factor=0.5)
    cluster.faults = SimpleNamespace(slow_link=[SimpleNamespace(**entry, start_s=1.0, end_s=2.0)])
    Topology(cluster)  # 0.5 x the NIC is above the floor (the NIC is not shared)
    cluster.faults.slow_link[0].factor = 0.01
    with pytest.raises(ConfigError, match=r"faults.slow_link\[0\].factor: 0.01 takes node0.nic0.tx"):
        Topology(cluster)


def test_down_link_loses_messages_from_its_time():
    topo = _topology()
    tx = topo.nic_tx[0][0]
    links = LinkModel(topo, down_ns={tx: 2_000_000})
    route = topo.route(0, 1)
    assert links.send(route, SIZE, 0) == (0, 1_000_000)
    assert links.send(route, SIZE, 2_000_000) is None
    # handed over before the failure but delivered after it: lost, the receiver's NIC not occupied
    assert links.receive(route, SIZE, 1_999_000, 2_500_000) is None
    assert links.messages[topo.nic_rx[1][0]] == 0
    assert NO_END_NS > 10**18  # open windows end after any valid fault time (1e9 s)
