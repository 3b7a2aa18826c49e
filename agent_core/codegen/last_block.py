"""The last block to finish: how a kernel whose blocks each hold a partial result combines them in the
same launch (a split row reduction, a class loss's sum over every row).

Thread 0 of each block publishes its partials, fences them, and counts the block in with an atomic on a
counter; the block that brings the count to `arrivals` is the last one, fences again so it sees every
partial, combines them in a fixed order (deterministic however the blocks were scheduled) and resets
the counter, so the kernel replays in a CUDA graph without a memset.
"""
from __future__ import annotations


def publish_and_arrive(publish: list[str], counter: str, arrivals: str, indent: str = "  ") -> list[str]:
    """Lines after which the block-uniform bool `last` says whether this block arrived last; every
    thread of the block must reach them. `publish`: thread 0's stores of the block's partials."""
    return [f"{indent}__shared__ bool last;",
            f"{indent}if (threadIdx.x == 0) {{",
            *[f"{indent}  {ln}" for ln in publish],
            f"{indent}  __threadfence();",
            f"{indent}  last = atomicAdd(&{counter}, 1u) == {arrivals} - 1;",
            f"{indent}}}",
            f"{indent}__syncthreads();"]


def reset_counter(counter: str, indent: str = "  ") -> str:
    return f"{indent}{counter} = 0u;  // ready for the next launch (and graph replay)"
