"""A real Prometheus, started from the shipped config, serves data for every dashboard panel."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from tests.emulator.monitoring.dashboards import for_prometheus, panel_expressions, prometheus_config
from tests.emulator.monitoring.helpers import free_port, scrape, start_emulator, stop, wait_for

PROMETHEUS = shutil.which("prometheus")
# ~8 s of run (~15k events an iteration, 0.25 s of CPU each; 120 of them had grown to 40 s):
# live-only series (ranks still running) get scraped several times at the 1 s scrape interval
ITERATIONS = 32
RATE_WINDOW = "10s"  # Grafana's $__rate_interval at a 1 s scrape interval is at least 4 scrapes


def _query(port: int, expr: str, since: float | None = None) -> list:
    """An instant query, or with ``since`` a range query from then to now (1 s steps)."""
    params = {"query": expr}
    if since is not None:
        params.update(start=f"{since:.3f}", end=f"{time.time():.3f}", step="1")
    api = "query" if since is None else "query_range"
    url = f"http://127.0.0.1:{port}/api/v1/{api}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus binary (Debian: apt-get install prometheus)")
def test_every_panel_expression_returns_data(tmp_path):
    """Scrape a 2-shard run with the shipped config; every panel's PromQL, for the run picked in the
    dashboards' variable, returns data at some moment of the run (some series exist only while it runs)."""
    exporter_port, prom_port = free_port(), free_port()
    config = prometheus_config()
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
    for job in config["scrape_configs"]:
        if job["job_name"] == "emulator":
            job["static_configs"][0]["targets"] = [f"127.0.0.1:{exporter_port}"]
        for sd in job.get("file_sd_configs", []):  # keep the Ray job, but never scrape a Ray on this machine
            sd["files"] = [str(tmp_path / "absent_ray_sd.json")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        # Prometheus first: the run's live-only series (ranks still running) exist only while it runs
        wait_for(lambda: _ready(prom_port), 30, "Prometheus to be ready")
    except BaseException:
        stop(prom)
        raise
    # with a straggler and a degraded NIC: the fault panels have data too
    emulator = start_emulator(exporter_port, tmp_path / "run", "--shards", "2", "--set", "cluster.nodes=2",
                              "--metrics-grace-s", "60", "--set", f"program_args.iterations={ITERATIONS}",
                              "--set", "faults.slow_gpu=[{ranks: [1], factor: 0.5}]",
                              "--set", "faults.slow_link=[{nic: {node: 1}, factor: 0.5}]")  # fmt: skip
    started = time.time()
    try:
        wait_for(lambda: (s := scrape(exporter_port)) and s["emulator_run_finished"] == 1, 180, "the run", emulator)
        # the final values scraped three times: every rate window holds samples
        wait_for(lambda: _query(prom_port, "sum_over_time(emulator_run_finished[30s]) >= 3"), 30, "three final scrapes")
        empty = []
        runs = [r["metric"]["run"] for r in _query(prom_port, "emulator_run_info")]
        assert runs == ["run"]  # the dashboards' variable: label_values(emulator_run_info, run)
        for board, title, expr in panel_expressions():
            if not _query(prom_port, for_prometheus(expr, RATE_WINDOW, runs[0]), since=started):
                empty.append(f"{board} {title!r}: {expr}")
        assert not empty, "panels without data:\n" + "\n".join(empty)
        assert float(_query(prom_port, "emulator_iterations_total")[0]["value"][1]) == ITERATIONS
        assert float(_query(prom_port, "emulator_cross_shard_messages_total")[0]["value"][1]) > 0
        assert _query(prom_port, 'emulator_run_status{status="completed"} == 1')
        assert not _query(prom_port, 'emulator_run_info{run="another"}')  # the filter picks one run
        info = _query(prom_port, "emulator_run_info")[0]["metric"]
        assert (info["run_id"], info["world_size"], info["shards"]) == ("run", "16", "2")
    finally:
        stop(emulator)
        stop(prom)
