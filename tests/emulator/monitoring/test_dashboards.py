"""Shipped dashboards and provisioning: well-formed for Grafana, wired together, metrics exist."""

from __future__ import annotations

import yaml

from emulator.monitoring.exporter import DEFAULT_PORT, sample_names
from tests.emulator.monitoring.dashboards import (
    DASHBOARDS,
    DEPLOY,
    load_dashboard,
    metric_names,
    panel_expressions,
    prometheus_config,
    unfiltered_selectors,
)

DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"


def test_both_dashboards_are_shipped():
    """The overview and the network dashboard exist, with distinct uids and titles."""
    boards = {p.name: load_dashboard(p) for p in DASHBOARDS}
    assert set(boards) == {"emulation-overview.json", "network.json"}
    assert len({b["uid"] for b in boards.values()}) == len({b["title"] for b in boards.values()}) == 2


def test_panels_are_well_formed():
    """Unique panel ids, a grid position, the provisioned datasource and targets with refIds on every panel."""
    uid = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]["uid"]
    for path in DASHBOARDS:
        board = load_dashboard(path)
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for panel in board["panels"]:
            where = f"{path.name}: panel {panel['id']} {panel['title']!r}"
            assert panel["type"] and panel["title"], where
            assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
            assert panel["datasource"]["uid"] == uid, where
            assert panel["targets"], f"{where}: no targets"
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), where
            for target in panel["targets"]:
                assert target["expr"].strip() and target["datasource"]["uid"] == uid, where


def test_every_panel_metric_is_exported():
    """Each metric named in a panel's PromQL is one the exporter defines."""
    defined = sample_names()
    for board, title, expr in panel_expressions():
        names = metric_names(expr)
        assert names, f"{board} {title!r}: no metric in {expr!r}"
        assert names <= defined, f"{board} {title!r}: unknown {sorted(names - defined)}"


def test_metric_name_parser():
    """The PromQL name extraction skips functions, label lists, matchers and windows."""
    expr = 'histogram_quantile(0.5, sum by (tier, le) (rate(a_bucket{tier="x"}[$__rate_interval]))) / on() b'
    assert metric_names(expr) == {"a_bucket", "b"}


def test_provisioning_is_wired_to_compose():
    """Compose mounts the config, the provisioning and the dashboards where the files expect them."""
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "emulator.yml").read_text())
    grafana = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in grafana
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in grafana
    prometheus = compose["services"]["prometheus"]["volumes"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus
    datasource = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    assert datasource["url"] == "http://localhost:9090"


def test_prometheus_scrapes_the_default_port():
    """The shipped Prometheus config scrapes the exporter's documented default port."""
    jobs = {job["job_name"]: job for job in prometheus_config()["scrape_configs"]}
    assert jobs["emulator"]["static_configs"][0]["targets"] == [f"localhost:{DEFAULT_PORT}"]


def test_every_panel_is_filtered_by_the_run_variable():
    """Both dashboards offer the runs Prometheus knows, and every selector of every panel picks one."""
    for path in DASHBOARDS:
        variables = {v["name"]: v for v in load_dashboard(path)["templating"]["list"]}
        assert variables["run"]["query"]["query"] == "label_values(emulator_run_info, run)", path.name
    for board, title, expr in panel_expressions():
        assert not unfiltered_selectors(expr), f"{board} {title!r}: {unfiltered_selectors(expr)}"
    assert unfiltered_selectors('sum by (tier) (rate(emulator_a_total{tier="x"}[1m])) / emulator_b{run="$run"}') == [
        'emulator_a_total{tier="x"}'
    ]


def test_busiest_links_are_per_tier():
    """The busiest-link panels rank links within each tier: a tier of many tied ports cannot hide another."""
    exprs = [expr for _, title, expr in panel_expressions() if "emulator_hottest_link" in expr]
    assert len(exprs) == 3 and all(expr.startswith("topk by (tier) (") for expr in exprs)
