"""Optional Weights & Biases logging of a finished run (``emulator run ... --wandb``).

    WANDB_PROJECT=cluster-emulation emulator run configs/examples/data-parallel.yaml --wandb

Logs the resolved config, the summary's figures (as the run summary), one step per iteration
(``iteration_time_s``), and the links, ranks and message-size tables; wandb's own environment
variables (``WANDB_PROJECT``, ``WANDB_MODE=offline``, ...) apply.
"""

from __future__ import annotations

import os

from emulator.errors import ConfigError
from emulator.results.compare import flatten
from emulator.results.rundir import RunTables

DEFAULT_PROJECT = "gpu-cluster-emulator"


def require_wandb():
    """The wandb module, or a ConfigError with the install command (checked before the run starts)."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("--wandb: wandb is not installed (pip install wandb)") from None
    return wandb


def log_run(data: RunTables, run_dir: str | None = None) -> str:
    """Log one run; returns the wandb run's URL (empty when offline)."""
    wandb = require_wandb()
    summary = data.summary
    try:
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT), name=summary.get("name") or None,
                         config=data.config, job_type="emulation")  # fmt: skip
    except Exception as exc:  # wandb raises its own errors (no API key, no network, a bad project)
        # the run has finished and its directory is written: say so, and how to log without an account
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        kept = f"the run is saved in {run_dir}; " if run_dir else ""
        raise ConfigError(f"--wandb: wandb could not start a run: {first} ({kept}WANDB_MODE=offline logs "
                          "without an account)") from None  # fmt: skip
    try:
        for step, seconds in enumerate(summary.get("iteration_times_s", [])):
            run.log({"iteration_time_s": seconds}, step=step)
        run.summary.update({k: v for k, v in flatten(summary).items() if v is not None})
        for name in ("links", "ranks", "histograms"):
            rows = getattr(data, name)
            if rows:
                run.log({name: wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])})
        if run_dir:
            run.summary["run_dir"] = str(run_dir)
        return getattr(run, "url", None) or ""
    finally:
        run.finish()
