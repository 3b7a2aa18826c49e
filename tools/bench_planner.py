"""Time the planner on a large program (default 5,000 nodes): `python tools/bench_planner.py [N]`.

The program is a deep stack of transformer-like blocks (linear + bias + gelu, residual adds, layer
norms, a decomposed softmax, sibling branches and skip connections), the shape of work the planner
sees on real models. Prints node count, regions, kernels and the planning time (best of 3 and median).
"""
from __future__ import annotations

import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0])

from agent_core.ir import Program  # noqa: E402
from agent_core.planner import plan_program  # noqa: E402


def build(n_nodes: int, rows: int = 512, width: int = 1024) -> Program:
    p = Program(f"bench{n_nodes}")
    x = p.add_input("x", (rows, width)).id
    w = p.add_parameter("w", shape=(width, width)).id
    b = p.add_parameter("b", shape=(width,)).id
    g = p.add_parameter("g", shape=(width,)).id
    skip = x
    k = 0
    while len(p.nodes) < n_nodes:
        k += 1
        h = p.add_node("linear", [x, w]).outputs[0]
        h = p.add_node("add", [h, b]).outputs[0]
        h = p.add_node("gelu", [h]).outputs[0]
        m = p.add_node("max", [h], {"dim": [1], "keepdim": True}).outputs[0]
        e = p.add_node("exp", [p.add_node("sub", [h, m]).outputs[0]]).outputs[0]
        s = p.add_node("sum", [e], {"dim": [1], "keepdim": True}).outputs[0]
        sm = p.add_node("div", [e, s]).outputs[0]
        left = p.add_node("tanh", [sm]).outputs[0]            # two siblings of one producer
        right = p.add_node("sigmoid", [sm]).outputs[0]
        y = p.add_node("mul", [left, right]).outputs[0]
        y = p.add_node("add", [y, x]).outputs[0]              # residual
        if k % 4 == 0:
            y = p.add_node("add", [y, skip]).outputs[0]       # a long skip connection
            skip = y
        y = p.add_node("layer_norm", [y, g], {"normalized_shape": [width]}).outputs[0]
        x = p.add_node("mul_scalar", [y], {"value": 0.5}).outputs[0]
    p.mark_output(x)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 5000
    p = build(n)
    times, cpu = [], []
    plan = None
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_program(p)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    # CPU time next to wall time: this machine is shared, and wall time includes waiting for a core
    print(f"nodes {len(p.nodes)}  regions {len(plan.active)}  kernels {plan.kernels}  "
          f"plan wall best {min(times):.3f} s median {statistics.median(times):.3f} s  "
          f"cpu best {min(cpu):.3f} s median {statistics.median(cpu):.3f} s")
    e = plan.estimate
    print(f"estimate: unfused {e.unfused_ms:.3f} ms ({e.kernels_unfused} kernels), planned "
          f"{e.planned_ms:.3f} ms, floor {e.floor_ms:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
