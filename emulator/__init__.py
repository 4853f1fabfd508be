"""emulator package: ``emulator.run(...)`` and ``emulator.load(...)`` are the notebook API (emulator/api.py).

    import emulator
    r = emulator.run("configs/examples/ping-pong.yaml")

Both are resolved lazily so that ``import emulator`` stays cheap (no matplotlib, no pandas). The
packages below are laid out in layers (ARCHITECTURE.md); ``run`` is a function here, the run
sequence itself lives in emulator/runner/sequence.py.
"""


def __getattr__(name: str):
    if name in ("run", "load"):
        from emulator import api

        return getattr(api, name)
    raise AttributeError(f"module 'emulator' has no attribute {name!r}")
