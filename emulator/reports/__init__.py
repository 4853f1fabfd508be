"""The pages a user sends on: the run report and the sweep report (HTML with embedded PNGs).

    emulator report runs/dp              # a run directory: run_report
    emulator report runs/sweep-bloom     # a sweep directory: sweep_report

Modules: ``pages`` (the page, its sections, tables and figures), ``run_report``, ``sweep_report``,
``published`` (a run's figures beside the published measurement it reproduces, where it is a
validation case of emulator/studies/validate.py).
"""
