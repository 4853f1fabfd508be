"""Built-in training workloads; ``layer_costs`` decomposes a transformer layer into operations.

Import the submodules directly; this package file stays import-free.
"""
