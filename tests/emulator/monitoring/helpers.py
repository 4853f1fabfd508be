"""Shared by the monitoring tests: free ports, an emulator run with its metrics endpoint, scraping."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUN_ONLY = re.compile(r'([a-z_]+)\{run="[^"]*"\} (\S+)')
EXAMPLE = ROOT / "configs" / "examples" / "data-parallel.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_emulator(port: int, out: Path, *extra: str) -> subprocess.Popen:
    """``emulator run`` of the data-parallel example serving metrics on ``port`` (quiet)."""
    cmd = [sys.executable, "-m", "emulator", "run", str(EXAMPLE), "--out", str(out), "--quiet",
           "--metrics-port", str(port), *extra]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def scrape(port: int) -> dict[str, float] | None:
    """Samples of ``/metrics`` labelled with nothing but their run, as {name: value}; None while the
    endpoint is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    samples = {}
    for line in text.splitlines():
        match = RUN_ONLY.fullmatch(line)
        if match:
            samples[match.group(1)] = float(match.group(2))
    return samples


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None):
    """Poll ``predicate`` every 0.1 s until it returns a truthy value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"emulator exited ({proc.returncode}) before {what}: {proc.stderr.read()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
