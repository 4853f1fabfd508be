"""The shipped deploy/ files, read the way Grafana and Prometheus read them (for the tests)."""

from __future__ import annotations

import json
import re

import yaml

from tests.emulator.monitoring.helpers import ROOT

DEPLOY = ROOT / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                   "unless", "le", "inf", "nan"}  # fmt: skip
FUNCTION_CALL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*\(")
IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def load_dashboard(path) -> dict:
    return json.loads(path.read_text())


def panel_expressions() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL) for every target of every panel."""
    panels = [(path.name, panel) for path in DASHBOARDS for panel in load_dashboard(path)["panels"]]
    return [(name, panel["title"], target["expr"]) for name, panel in panels for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    expr = re.sub(r'"[^"]*"', "", expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range windows
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    functions = set(FUNCTION_CALL.findall(expr))
    return {
        name for name in IDENTIFIER.findall(expr)
        if name not in functions and name.lower() not in PROMQL_KEYWORDS and not name.startswith("$")
    }  # fmt: skip


def for_prometheus(expr: str, rate_window: str, run: str) -> str:
    """Grafana's variables replaced the way Grafana would before sending the query."""
    return expr.replace("$__rate_interval", rate_window).replace("$run", run)


def unfiltered_selectors(expr: str) -> list[str]:
    """Metric selectors of ``expr`` that do not pick the dashboard's run (``run="$run"``)."""
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    return [m.group(0) for m in re.finditer(r"\b(emulator_[a-z_]+)(\{[^}]*\})?", expr)
            if 'run="$run"' not in (m.group(2) or "")]  # fmt: skip


def prometheus_config() -> dict:
    return yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
