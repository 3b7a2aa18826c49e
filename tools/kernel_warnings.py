"""Compile every kernel codegen makes for resources/examples with nvcc, warnings on, and count them.

Each example is imported, planned, and every region codegen supports is generated with its default
parameters and each tuning variant (agent_core.agent.tune.tune_space, as the agent loop compiles
them). Sources are deduplicated, compiled with nvcc for sm_90 in a temporary directory (nothing is
cached), and the warnings are grouped by kernel kind and schedule.

    .venv/bin/python tools/kernel_warnings.py [--jobs 2] [--show 5] [examples...]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_core.agent.tune import tune_space  # noqa: E402
from agent_core.codegen import CodegenError, generate_kernel  # noqa: E402
from agent_core.importers import import_file  # noqa: E402
from agent_core.planner import plan_program  # noqa: E402

NVCC_FLAGS = ["-arch=sm_90", "-c", "-std=c++17", "-Xcudafe", "--display_error_number",
              "-Wno-deprecated-gpu-targets", "-Xptxas", "-warn-spills"]
WARNING = re.compile(r"warning(?: #(\d+)-D)?: (.*)")


def kernels(paths):
    """(label, kernel kind key, source) for every distinct generated source."""
    seen = set()
    for path in paths:
        try:
            program = import_file(path)
        except Exception as exc:
            print(f"{path.name}: import failed: {exc}", file=sys.stderr)
            continue
        plan = plan_program(program)
        for region in plan.active:
            name = f"{path.stem}_{region.id}"
            try:
                ks = generate_kernel(program, region.nodes, name=name, kind=region.kind)
            except CodegenError:
                continue
            variants = [ks]
            for params in tune_space(ks):
                try:
                    variants.append(generate_kernel(program, region.nodes, name=name, kind=region.kind,
                                                    params=params))
                except CodegenError:
                    pass
            for i, k in enumerate(variants):
                if k.source in seen:
                    continue
                seen.add(k.source)
                schedule = (k.params or {}).get("schedule", "")
                key = k.kind + (f"/{schedule}" if schedule else "") + ("+library" if k.library_nodes else "")
                yield f"{name}#{i}", key, k.source


def compile_one(nvcc, workdir, label, source):
    cu = Path(workdir) / f"{re.sub(r'[^A-Za-z0-9_#]', '_', label).replace('#', '_v')}.cu"
    cu.write_text(source)
    r = subprocess.run([nvcc, *NVCC_FLAGS, str(cu), "-o", str(cu.with_suffix(".o"))],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("examples", nargs="*", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--show", type=int, default=3, help="example warning lines printed per kind")
    args = ap.parse_args(argv)
    nvcc = shutil.which("nvcc")
    if not nvcc:
        print("nvcc not found on PATH", file=sys.stderr)
        return 2
    paths = args.examples or sorted((ROOT / "resources" / "examples").glob("*.py"))
    items = list(kernels(paths))
    per_kind = Counter(key for _, key, _ in items)
    warnings: dict[str, Counter] = defaultdict(Counter)
    samples: dict[str, list[str]] = defaultdict(list)
    failed = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        results = pool.map(lambda it: compile_one(nvcc, tmp, it[0], it[2]), items)
        for (label, key, _), (rc, log) in zip(items, results):
            if rc:
                failed.append((label, log.strip().splitlines()[:3]))
            for line in log.splitlines():
                m = WARNING.search(line)
                if m:
                    text = re.sub(r"\"[^\"]*\"", '"..."', m.group(2))
                    warnings[key][f"#{m.group(1) or '-'} {text}"] += 1
                    if len(samples[key]) < args.show:
                        samples[key].append(f"{label}: {line.split('/')[-1]}")
    total = sum(sum(c.values()) for c in warnings.values())
    print(f"{len(items)} distinct kernels from {len(paths)} examples; nvcc {' '.join(NVCC_FLAGS)}")
    for key in sorted(per_kind):
        c = warnings.get(key, Counter())
        print(f"{key}: {per_kind[key]} kernels, {sum(c.values())} warnings")
        for text, n in c.most_common():
            print(f"    {n:4d}  {text}")
        for s in samples.get(key, []):
            print(f"      e.g. {s}")
    for label, lines in failed:
        print(f"FAILED {label}: " + " | ".join(lines))
    print(f"total: {total} warnings, {len(failed)} failed compiles")
    return 1 if total or failed else 0


if __name__ == "__main__":
    sys.exit(main())
