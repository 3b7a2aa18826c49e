"""The last block to finish: how a kernel whose blocks each hold a partial result combines them in the
same launch (a split row reduction, a split column reduction, a class loss's sum over every row).

The threads that hold the block's partials publish them and fence; one thread counts the block in
with an atomic on a counter; the block that brings the count to `arrivals` is the last one, fences
again so it sees every partial, combines them in a fixed order (deterministic however the blocks were
scheduled) and resets the counter, so the kernel replays in a CUDA graph without a memset.
"""
from __future__ import annotations

FIRST_THREAD = "threadIdx.x == 0"


def publish_and_arrive(publish: list[str], counter: str, arrivals: str, indent: str = "  ",
                       publisher: str = FIRST_THREAD, arriver: str = FIRST_THREAD,
                       sync: str = "__syncthreads();") -> list[str]:
    """Lines after which the block-uniform bool `last` says whether this block arrived last; every
    thread of the block must reach them. `publish`: the stores of the block's partials made by the
    threads where `publisher` holds; `arriver` is the one thread that counts the block in; `sync`: the
    barrier of the threads taking part (a block's, or a warp-specialised kernel's named one)."""
    arrive = f"last = atomicAdd(&{counter}, 1u) == {arrivals} - 1;"
    if publisher == arriver:
        return [f"{indent}__shared__ bool last;",
                f"{indent}if ({publisher}) {{",
                *[f"{indent}  {ln}" for ln in publish],
                f"{indent}  __threadfence();",
                f"{indent}  {arrive}",
                f"{indent}}}",
                f"{indent}{sync}"]
    # several publishers: each fences its own stores, the barrier orders them before the arrival
    return [f"{indent}__shared__ bool last;",
            f"{indent}if ({publisher}) {{",
            *[f"{indent}  {ln}" for ln in publish],
            f"{indent}  __threadfence();",
            f"{indent}}}",
            f"{indent}{sync}",
            f"{indent}if ({arriver}) {arrive}",
            f"{indent}{sync}"]


def reset_counter(counter: str, indent: str = "  ") -> str:
    return f"{indent}{counter} = 0u;  // ready for the next launch (and graph replay)"
