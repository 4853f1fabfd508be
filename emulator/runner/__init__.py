"""The run sequence, written once (``sequence``): check, lay out, run on a backend, write the run
directory. ``budget`` refuses a run the host cannot hold; ``jobs`` cuts each job's results out of
a run of several jobs and writes its folder.

    emulator run configs/examples/ping-pong.yaml --out runs/pp
"""
