"""The writer tests' shared case: a small program that plans to exactly one row-reduction region
(x[32, 200] -> softmax over the last axis -> * w[200] + b[200]), our kernel for it, and the model
replies recorded for it (tests/data/writer/replies/NAME.md: prose, one ```cuda block, one ```json
launch block, written for this region's kernel name, argument order and shapes)."""
from __future__ import annotations

from pathlib import Path

from agent_core.ir import Program

REPLIES = Path(__file__).parent / "data" / "writer" / "replies"
KERNEL_NAME = "writer_demo_r1"      # what agent.loop.kernel_name gives the region; the replies use it
ROWS, COLS = 32, 200


def case_program() -> Program:
    p = Program("writer_demo")
    x = p.add_input("x", (ROWS, COLS))
    w = p.add_parameter("w", shape=(COLS,))
    b = p.add_parameter("b", shape=(COLS,))
    s = p.add_node("softmax", [x.id], {"dim": -1})
    m = p.add_node("mul", [s.outputs[0], w.id])
    a = p.add_node("add", [m.outputs[0], b.id])
    p.mark_output(a.outputs[0])
    return p


def region_and_ours(program: Program | None = None):
    """(the one planned region, our KernelSource for it); `program` (default a fresh case_program())
    is planned in place. Node ids are deterministic, so the region also names a fresh case_program()'s nodes."""
    from agent_core.agent.loop import kernel_name
    from agent_core.codegen import generate_kernel
    from agent_core.planner import apply_plan, plan_program
    p = program or case_program()
    plan = plan_program(p)
    apply_plan(p, plan)
    assert len(plan.active) == 1, [r.id for r in plan.active]
    region = plan.active[0]
    name = kernel_name(p, region.id)
    assert name == KERNEL_NAME, name   # the recorded replies are written for this name
    return region, generate_kernel(p, region.nodes, name=name, kind=region.kind)


def reply_text(name: str) -> str:
    return (REPLIES / f"{name}.md").read_text()
