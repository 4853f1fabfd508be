"""Studies built on many runs, or on none: what a user asks before or around a run.

    emulator sweep configs/sweeps/bloom-560m-batch-zero.yaml      # sweep: a grid of runs
    emulator plan configs/runs/gpt3-175b-1024gpu.yaml             # plan: estimate, then emulate the best
    emulator goodput configs/runs/megatron-22b-8gpu.yaml          # goodput: failures over a long run
    emulator validate                                             # validate: published measurements
    emulator collbench --cluster dgx-a100-hdr --gpus 16           # collbench: nccl-tests on the network model

``estimate`` is the closed-form iteration estimate the planner ranks candidates with;
``validation_cases`` holds the published cases ``validate`` and the run report compare against.
"""
