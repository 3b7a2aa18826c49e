"""A region the user drew, accepted or locked is their decision: optimize's rewrites leave its nodes
alone and the region comes out of the run as it went in (it used to be dropped with the proposals)."""
import json
import subprocess
import sys

from agent_core.ir import Program
from agent_core.project_file import save_program
from agent_core.regions import Region


def two_losses() -> Program:
    p = Program(name="two_losses")
    a, b = p.add_input("a", (6, 7)), p.add_input("b", (6, 7))
    kept = p.add_node("mse_loss", [a.id, b.id], attrs={"reduction": "mean"})
    lowered = p.add_node("mse_loss", [b.id, a.id], attrs={"reduction": "sum"})
    p.mark_output(kept.outputs[0])
    p.mark_output(lowered.outputs[0])
    p.regions.append(Region("r9", "reduction", [kept.id], status="locked"))
    return p


def test_optimize_keeps_a_locked_region_and_rewrites_only_around_it(tmp_path):
    prog = two_losses()
    src = tmp_path / "prog.json"
    save_program(prog, str(src))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(src), "--cpu", "--no-tune",
                          "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    fired = [e["node"] for e in events if e["event"] == "rewrite" and e["kept"]]
    kept_id, lowered_id = list(prog.nodes)
    assert kept_id not in fired and lowered_id in fired      # the loss outside the region was lowered
    saved = json.loads((out / "program.json").read_text())
    regions = {r["id"]: r for r in saved["regions"]}
    assert regions["r9"]["status"] == "locked" and regions["r9"]["nodes"] == [kept_id]
    assert any(n["id"] == kept_id and n["op"] == "mse_loss" for n in saved["nodes"])
