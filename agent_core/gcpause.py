"""`paused_gc()`: the cyclic garbage collector held off for a burst of allocations.

Opening and planning a large program make tens of thousands of short-lived objects and no cycles
worth collecting: a collection in the middle only rescans the whole heap, again and again. The
previous state is restored, so pauses nest.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def paused_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
