"""Running stitchcuda's work on a Ray cluster (docs/CLUSTER.md): `bench --ray`.

Ray is an optional extra (`pip install '.[cluster]'`); nothing here imports it at module level, so
agent_core imports and runs without it and `--ray` says how to install it.
"""
from __future__ import annotations

from ..errors import StitchError

INSTALL_HINT = "pip install '.[cluster]' (or pip install 'ray>=2.9')"


class ClusterError(StitchError):
    """Ray is missing or the cluster cannot be reached; the message says what to do."""


def require_ray():
    """The ray module, or ClusterError naming the install command."""
    try:
        import ray
    except ImportError as exc:
        raise ClusterError(f"--ray needs Ray, which is not installed here ({exc}): {INSTALL_HINT}") from None
    return ray
