"""Joining a Ray cluster for a run: `local` starts one on this machine for the run's length, `auto`
joins the one `ray start` runs here, anything else is an address (host:6379, ray://host:10001)."""
from __future__ import annotations

import contextlib
import os
import signal
import threading

from . import ClusterError, require_ray


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # agent_core/


@contextlib.contextmanager
def cluster(address: str):
    """Connected for the block; a `local` cluster is stopped afterwards, a joined one is left running.

    Workers of a joined cluster get this agent_core through Ray's runtime_env (py_modules), so every
    node runs the driver's code; a local cluster's workers import it from the driver's own sys.path."""
    ray = require_ray()
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address == "local":
        kwargs["address"] = "local"
    else:
        kwargs["address"] = address
        kwargs["runtime_env"] = {"py_modules": [_package_dir()],
                                 "excludes": ["__pycache__", "*.pyc", "*.cubin"]}
        kwargs.pop("include_dashboard")    # only a new local cluster takes it
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"--ray {address}: cannot reach the Ray cluster: {exc}") from None
    if threading.current_thread() is threading.main_thread():
        # Ctrl+C stays Python's KeyboardInterrupt (the CLI cancels the tasks and exits 130) whatever
        # handler Ray's start-up left: a loaded CI run once saw the driver ignore it and run to the end
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield ray
    finally:
        ray.shutdown()


def slots(ray, gpu: bool) -> int:
    """How many problems may run at once: one per GPU (each timed problem holds its GPU alone),
    else one per CPU; read again each time so an autoscaled cluster's new nodes are used."""
    res = ray.cluster_resources()
    return max(1, int(res.get("GPU", 0) if gpu else res.get("CPU", 1)))


def has_gpus(ray) -> bool:
    return ray.cluster_resources().get("GPU", 0) >= 1


def other_nodes(ray, node_id: str | None, gpu: bool) -> list[str]:
    """Alive nodes other than `node_id` with the resource a problem needs (where a retry goes)."""
    need = "GPU" if gpu else "CPU"
    return [n["NodeID"] for n in ray.nodes()
            if n.get("Alive") and n["NodeID"] != node_id and n.get("Resources", {}).get(need, 0) >= 1]
