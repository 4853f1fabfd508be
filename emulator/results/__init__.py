"""What a run leaves for its users: the run directory, the trace, the report and run comparison.

    emulator run configs/examples/data-parallel.yaml --out runs/dp   # writes the run directory
    emulator report runs/dp                                          # plots + one HTML page
    emulator compare runs/dp runs/dp-bigger-grads                    # config and result deltas

Modules: ``tables`` (rows derived from a run's raw results), ``rundir`` (writing and reading the
run directory), ``trace`` (Chrome Trace Event JSON), ``plots`` / ``report`` (matplotlib, imported
only when pictures are asked for), ``compare``, ``wandb_log``.
"""
