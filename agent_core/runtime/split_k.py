"""An fp32 GEMM with few output tiles and a long reduction, its K split into parts ("fp32-splitk").

A linear of 394 rows from 2048 to 512 features (KernelBench level 3's VisionTransformer MLP) has 16
output tiles of 128 x 128 for 132 SMs: cuBLAS's fp32 call ran it in about 65 us on the H100, at 13
TFLOP/s. Cut K into s parts and the same products become one strided-batched GEMM of s x 16 tiles
([s, M, K/s] x [s, K/s, N], views of the operands, no copy), then one sum over the s partial products
and the bias: every SM busy, for s partial outputs written and read once more.

Memory: the s partial products live while the call runs. Where the memory budget leaves room for
fewer than fill the SMs, the agent cuts fewer (parts_within; the count is kept in program.metadata
so the runtime, the memory plan and the calls sharing the form use it), and the memory plan can set
the call back to plain fp32 like a split-TF32 one.

Precision: plain fp32 products and sums (TF32 off), the sum in a different order than cuBLAS's, so
it is as accurate as fp32 but not bit-identical; the agent times it beside the other forms per node
(agent/precision.py) and keeps it only where it agrees with fp32 and is faster.
"""
from __future__ import annotations

import math

from ..analysis.gpu import H200
from ..ir import Program

SPLIT_K = "fp32-splitk"
PARTS_KEY = "split_k_parts"   # program.metadata: node id -> its part count, where the memory budget cut it
TILE = 128              # a cuBLAS output tile's side, for counting how many an output fills
MIN_PART = 256          # the shortest reduction a part keeps (shorter ones are mostly load latency)
MIN_ROWS = 64           # fewer rows is a matrix-vector product: bound by reading the weight, not by SMs


def _dims(program: Program, node_id: str) -> tuple[int, int, int] | None:
    """(M, K, N) of a linear, or of a matmul of an activation by a 2-D matrix; None for other nodes."""
    node = program.nodes[node_id]
    if any(program.values[v].dtype != "float32" for v in node.inputs if v):
        return None
    a, b = (program.values[v].shape for v in node.inputs[:2])
    if len(a) < 2 or len(b) != 2:
        return None
    if node.op == "linear":
        n, k = b
    elif node.op == "matmul":
        k, n = b
    else:
        return None
    return math.prod(a[:-1]), k, n


def parts(program: Program, node_id: str) -> int:
    """How many parts this node's reduction is cut into: the count the agent fixed for it to fit the
    memory budget (program.metadata["split_k_parts"], see parts_within), else most_parts."""
    fixed = (program.metadata.get(PARTS_KEY) or {}).get(node_id)
    return int(fixed) if fixed else most_parts(program, node_id)


def parts_within(program: Program, node_id: str, room: int | None) -> int:
    """The most parts, down from most_parts by halves, whose partial products (one output's worth
    each) fit in `room` bytes (None: no limit); 1 where not even two fit. 28_VisionTransformer (batch
    2) has a budget of 6.9 MiB, eager's peak: 2.3 MiB left at its 2048-to-512 linear held two parts of
    its 0.8 MB output, not the eight that fill the SMs."""
    s = most_parts(program, node_id)
    if room is None:
        return s
    out = program.values[program.nodes[node_id].outputs[0]]
    while s > 1 and s * out.nbytes > room:
        s //= 2
    return s


def fit_parts(program: Program, node_id: str, room: int | None) -> None:
    """Fix the node's part count (program.metadata["split_k_parts"]) to parts_within(room), where
    that is fewer than most_parts; none fixed otherwise."""
    forget_parts(program, node_id)
    s = parts_within(program, node_id, room)
    if 1 < s < most_parts(program, node_id):
        program.metadata.setdefault(PARTS_KEY, {})[node_id] = s


def forget_parts(program: Program, node_id: str) -> None:
    """The node runs in another form: no part count of its own."""
    (program.metadata.get(PARTS_KEY) or {}).pop(node_id, None)


def share_parts(program: Program, timed: str, node_id: str) -> None:
    """A node that takes the form chosen on a node of the same call (agent.precision_share) takes its
    part count too: the count fixed for the budget there, or none."""
    forget_parts(program, node_id)
    table = program.metadata.get(PARTS_KEY) or {}
    if timed in table:
        table[node_id] = table[timed]


def most_parts(program: Program, node_id: str, sm_count: int = H200.sm_count) -> int:
    """The fewest powers of two that give at least one tile per SM, each part at least MIN_PART long
    and K divisible by their count; 1 where splitting does not apply (enough tiles already, a short K,
    a matrix-vector product, another op)."""
    dims = _dims(program, node_id)
    if dims is None:
        return 1
    m, k, n = dims
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE)
    if m < MIN_ROWS or 2 * tiles > sm_count:
        return 1
    s = 1
    while tiles * s < sm_count and k % (2 * s) == 0 and k // (2 * s) >= MIN_PART:
        s *= 2
    return s


def can_split_k(program: Program, node_id: str) -> bool:
    return most_parts(program, node_id) > 1


def run_split_k(program: Program, node_id: str, env: dict) -> None:
    """The node's output as the sum of its s partial products, computed by one batched GEMM."""
    import torch
    node = program.nodes[node_id]
    s = parts(program, node_id)
    a, b = env[node.inputs[0]], env[node.inputs[1]]
    bias = env[node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else None
    k = a.shape[-1]
    rows = a.reshape(-1, k)
    a_parts = rows.unflatten(1, (s, k // s)).transpose(0, 1)               # [s, M, K/s]
    # B as [s, K/s, N]: a linear's [N, K] weight read transposed, a matmul's [K, N] cut along its rows
    b_parts = b.unflatten(1, (s, k // s)).permute(1, 2, 0) if node.op == "linear" else b.unflatten(0, (s, k // s))
    out = torch.bmm(a_parts, b_parts).sum(0)
    if bias is not None:
        out.add_(bias)
    env[node.outputs[0]] = out.reshape(*a.shape[:-1], out.shape[-1])
