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


def run(args) -> int:
    from ..analysis.cost import fmt_ms
    from ..memory_check import DoesNotFit, require_fits
    from ..planner import apply_plan, plan_program
    from ..rewrites import rewrite_program
    from ..rewrites.engine import CHECK_DRAWS
    from ..text import plural
    from .import_cmd import open_program

    program = open_program(args.program)
    program.check()
    rewrites = skipped = None
    if not args.no_rewrite:
        try:
            if not args.no_check:  # checking rewrites runs the reference on the CPU, every draw held
                require_fits(program, "cpu", label=args.program, runs=CHECK_DRAWS)
            rewrites = rewrite_program(program, check=not args.no_check)
            program = rewrites.program
        except DoesNotFit as e:  # refused before it allocated: plan the program unrewritten
            skipped = f"rewrites skipped: {e.reason}"
            print(f"stitchcuda plan: {args.program}: {skipped}", file=sys.stderr)
    plan = plan_program(program, graph=not args.eager)
    apply_plan(program, plan)
    if args.output:
        from ..project_file import save_program
        save_program(program, args.output)
    est = plan.estimate
    if args.json:
        out = {"program": program.name, "nodes": len(program.nodes), **plan.to_dict(),
               "rewrites": {"fired": rewrites.fired if rewrites else [],
                            "refused": rewrites.refused if rewrites else [], "skipped": skipped}}
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if rewrites is not None:
        for e in rewrites.fired:
            print(f"rewrite {e['rule']}: {e['message']}")
        for e in rewrites.refused:
            print(f"rewrite {e['rule']} refused at {e['node']}: {e.get('error', e['message'])}")
    for r in plan.regions:
        names = ", ".join(program.nodes[n].name for n in r.nodes if n in program.nodes)
        extra = f" [{r.schedule['schedule']}]" if r.schedule.get("schedule") else ""
        print(f"{r.id} {r.kind}{extra} ({r.status}): {names}")
        print(f"    {r.reason}")
    print(f"{plural(len(program.nodes), 'node')} -> {plural(len(plan.active), 'region')}, "
          f"{plural(plan.kernels, 'kernel')} "
          f"(planned in {plan.seconds * 1000:.0f} ms)")
    print(f"estimate on {'Python launches' if args.eager else 'a CUDA graph'}: unfused {fmt_ms(est.unfused_ms)} "
          f"({plural(est.kernels_unfused, 'kernel')}), planned {fmt_ms(est.planned_ms)}, floor {fmt_ms(est.floor_ms)}")
    if args.output:
        print(f"saved {args.output}")
    return 0
