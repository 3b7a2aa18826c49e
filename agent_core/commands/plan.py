"""`stitchcuda plan prog.json|model.py`: rewrite, then propose fused and stitched regions.

Prints the rewrites that fired, each region with its kind, nodes and reason, and the estimate for the
whole program: every op its own kernel (unfused), the plan, and the floor. `-o` saves the rewritten
program with its regions; `--json` prints the same as JSON. Planning itself allocates no tensors;
checking the rewrites runs the reference, so a program too large for this machine is planned as it
is, with a note that its rewrites were skipped and why.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # the command module loads no torch until its command runs (tests/test_layering.py)
    from ..ir import Program
    from ..planner.plan import Plan
    from ..rewrites.edits import RewriteResult

HELP = "propose fused and stitched regions with their reasons"


def add_arguments(parser) -> None:
    parser.add_argument("program", help="a program file (.json), a KernelBench .py file or module:Class")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("-o", "--output", help="save the (rewritten) program with its regions here")
    parser.add_argument("--no-rewrite", action="store_true", help="plan the program as it is")
    parser.add_argument("--no-check", action="store_true",
                        help="keep rewrites without checking them numerically (faster, for huge programs)")
    parser.add_argument("--eager", action="store_true",
                        help="estimate launches as Python launches (6 us) instead of CUDA-graph nodes")


@dataclass
class Planned:
    """What `stitchcuda plan` makes of a program: the rewritten program with its regions installed,
    the plan, the rewrite report (None when rewrites were off or skipped) and why they were skipped."""
    program: Program
    plan: Plan
    rewrites: RewriteResult | None = None
    skipped: str | None = None

    def to_dict(self) -> dict:
        """The --json output."""
        r = self.rewrites
        return {"program": self.program.name, "nodes": len(self.program.nodes), **self.plan.to_dict(),
                "rewrites": {"fired": r.fired if r else [], "refused": r.refused if r else [],
                             "skipped": self.skipped}}

    def lines(self, *, eager: bool = False) -> list[str]:
        """The text output: rewrites that fired or were refused, each region, the totals, the estimate."""
        from ..analysis.cost import fmt_ms
        from ..text import plural
        program, plan, out = self.program, self.plan, []
        if self.rewrites is not None:
            out += [f"rewrite {e['rule']}: {e['message']}" for e in self.rewrites.fired]
            out += [f"rewrite {e['rule']} refused at {e['node']}: {e.get('error', e['message'])}"
                    for e in self.rewrites.refused]
        for r in plan.regions:
            names = ", ".join(program.nodes[n].name for n in r.nodes if n in program.nodes)
            extra = f" [{r.schedule['schedule']}]" if r.schedule.get("schedule") else ""
            out += [f"{r.id} {r.kind}{extra} ({r.status}): {names}", f"    {r.reason}"]
        est = plan.estimate
        out.append(f"{plural(len(program.nodes), 'node')} -> {plural(len(plan.active), 'region')}, "
                   f"{plural(plan.kernels, 'kernel')} (planned in {plan.seconds * 1000:.0f} ms)")
        out.append(f"estimate on {'Python launches' if eager else 'a CUDA graph'}: unfused {fmt_ms(est.unfused_ms)} "
                   f"({plural(est.kernels_unfused, 'kernel')}), planned {fmt_ms(est.planned_ms)}, "
                   f"floor {fmt_ms(est.floor_ms)}")
        return out


def plan_loaded(program, *, label: str, rewrite: bool = True, check: bool = True, eager: bool = False) -> Planned:
    """Rewrite (each rewrite checked on the reference unless check=False; skipped, with the reason,
    when the check would not fit this machine's memory), plan, and install the regions on the program."""
    from ..memory_check import DoesNotFit, require_fits
    from ..planner import apply_plan, plan_program
    from ..rewrites import rewrite_program
    from ..rewrites.engine import CHECK_DRAWS

    program.check()
    rewrites = skipped = None
    if rewrite:
        try:
            if check:  # checking rewrites runs the reference on the CPU, every draw held
                require_fits(program, "cpu", label=label, runs=CHECK_DRAWS)
            rewrites = rewrite_program(program, check=check)
            program = rewrites.program
        except DoesNotFit as e:  # refused before it allocated: plan the program unrewritten
            skipped = f"rewrites skipped: {e.reason}"
    plan = plan_program(program, graph=not eager)
    apply_plan(program, plan)
    return Planned(program, plan, rewrites, skipped)


def run(args) -> int:
    from .import_cmd import open_program

    done = plan_loaded(open_program(args.program), label=args.program, rewrite=not args.no_rewrite,
                       check=not args.no_check, eager=args.eager)
    if done.skipped:
        print(f"stitchcuda plan: {args.program}: {done.skipped}", file=sys.stderr)
    if args.output:
        from ..project_file import save_program
        save_program(done.program, args.output)
    if args.json:
        json.dump(done.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print("\n".join(done.lines(eager=args.eager)))
    if args.output:
        print(f"saved {args.output}")
    return 0
