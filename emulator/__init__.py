"""emulator package: ``emulator.run(...)`` and ``emulator.load(...)`` are the notebook API (emulator/api.py).

    import emulator
    r = emulator.run("configs/examples/ping-pong.yaml")

Both are resolved lazily so that ``import emulator`` stays cheap (no matplotlib, no pandas).
"""


def __getattr__(name: str):
    if name == "run":
        import importlib

        # the submodule emulator.run becomes this attribute anyway once imported; it is callable
        return importlib.import_module("emulator.run")
    if name == "load":
        from emulator.api import load

        return load
    raise AttributeError(f"module 'emulator' has no attribute {name!r}")
