"""``emulator sweep --backend ray``: one Ray task per point over the session's four-node Ray, the
same rows as the local worker processes."""

from __future__ import annotations

from pathlib import Path

from emulator.studies.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_on_ray_gives_the_local_rows(ray_cluster, tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {ROOT / 'configs/examples/ping-pong.yaml'}\n"
                     "points:\n  - {program_args.iterations: 1}\n  - {program_args.size: 65536}\n"
                     "  - {cluster.nodes: -1}\n  - {program: '" + str(ROOT / "configs/examples/programs.py")
                     + ":deadlock'}\n")  # fmt: skip
    _, on_ray = run_sweep(sweep, out=tmp_path / "ray", backend="ray", workers=2, quiet=True)
    _, local = run_sweep(sweep, out=tmp_path / "local", workers=2, quiet=True)
    assert [r["status"] for r in on_ray] == ["ok", "ok", "invalid", "deadlock"]
    drop = ("wall_time_s",)  # the one figure that is the machine's, not the run's
    assert [{k: v for k, v in r.items() if k not in drop} for r in on_ray] == \
        [{k: v for k, v in r.items() if k not in drop} for r in local]  # fmt: skip
