"""What bench --ray and optimize --ray share about their tasks: which failures are a worker's death
(worth one retry) and which are the task's own, the retry's placement on another node, the reason
line, and Ctrl+C read between two results instead of wherever it lands."""
from __future__ import annotations

import os
import signal
import socket
import threading
from dataclasses import dataclass, field

from .connect import other_nodes

ATTEMPTS = 2          # the first run and one retry


def where() -> dict:
    """The worker a task runs in (a task's first item, so the driver knows whom a retry avoids)."""
    import ray
    return {"host": socket.gethostname(), "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


def worker_died(ray, exc) -> bool:
    """A failure of the machine, not of the task's Python: those are the ones worth a retry."""
    names = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "LocalRayletDiedError", "ObjectLostError",
             "OwnerDiedError", "RaySystemError")
    kinds = tuple(k for k in (getattr(ray.exceptions, n, None) for n in names) if isinstance(k, type))
    return isinstance(exc, kinds)


def reason(exc) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:300]}"


def retry_options(ray, avoid: str | None, gpu: bool) -> dict:
    """Task options that send a retry "elsewhere": another node with the resource, if the cluster has one."""
    others = other_nodes(ray, avoid, gpu) if avoid else []
    if not others:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(others[0], soft=True)}


@dataclass
class Interrupt:
    """SIGINT sets a flag the loop reads between two results, instead of raising wherever it lands."""
    event: threading.Event = field(default_factory=threading.Event)
    old: object = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, lambda *a: self.event.set())
        return self.event

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
