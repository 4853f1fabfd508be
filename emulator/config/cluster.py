"""The run file's ``cluster:`` section: defined with the network model (netmodel/spec.py)."""

from __future__ import annotations

from netmodel.spec import ClusterConfig, NicConfig, NodeGroupConfig, ScaleUpConfig, SwitchTierConfig

__all__ = ["ClusterConfig", "NicConfig", "NodeGroupConfig", "ScaleUpConfig", "SwitchTierConfig"]
