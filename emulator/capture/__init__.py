"""Bring your own PyTorch script: per-rank capture under fake tensors (rank.py) and the torchrun verb (torchrun.py)."""
