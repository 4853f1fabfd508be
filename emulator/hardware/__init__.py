"""Hardware models: the GPU catalogue (``gpus``) and the roofline compute model (``compute``).

Import the submodules directly (``from emulator.hardware.gpus import get_gpu``); this package
file stays import-free so that importing it costs nothing.
"""
