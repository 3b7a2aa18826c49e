"""Editor benchmarks (offscreen): opening a large program with layout, and pan/zoom repaint times.

    .venv/bin/python tools/bench_editor.py [--open-nodes 5000] [--paint-nodes 2000] [--grandalf]

It also opens, lays out and repaints ResNet101 (tools/resnets.py, imported with import_nn_module:
module boxes, its 33 Bottlenecks collapsed), and the 5,000-node program.

The large program is decoder_program(): a Llama-style stack of decoder layers (RMSNorm, q/k/v
projections split into heads, rotary embedding, attention, o_proj, SwiGLU MLP, two residual adds:
LAYER_NODES nodes a layer, about what torch.export makes of one), carrying the module paths an import
records (agent_core.importers.module_paths), so it opens grouped and collapsed as a real model does.
Programs are cached under test-output/bench/ as project files. Both wall and CPU time are reported:
the development machine is shared, and CPU time is what the editor itself spends.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from agent_core.ir import Program  # noqa: E402

LAYER_NODES = 36


def decoder_program(n_nodes: int, d: int = 256, t: int = 64, heads: int = 4) -> Program:
    """About n_nodes nodes: embedding, (n_nodes - 4) // LAYER_NODES decoder layers on a [1, t, d]
    activation, final norm and lm_head, each node with the module path of its Llama-style module."""
    p = Program(f"decoder_{n_nodes}")
    hd = d // heads
    paths: dict[str, str] = {}
    classes = {"model": "LlamaModel", "model.embed_tokens": "Embedding", "model.norm": "LlamaRMSNorm",
               "lm_head": "Linear"}
    where = [""]

    def node(op, ins, attrs=None):
        n = p.add_node(op, ins, attrs)
        paths[n.id] = where[0]
        return n.outputs[0]

    def param(name, shape):
        return p.add_parameter(name, shape=shape).id

    tokens = p.add_input("input_ids", (1, t), "int64").id
    cos, sin = param("rope_cos", (t, hd)), param("rope_sin", (t, hd))
    where[0] = "model.embed_tokens"
    h = node("embedding", [tokens, param("embed_tokens", (512, d))])
    for i in range(max(1, (n_nodes - 4) // LAYER_NODES)):
        layer = f"model.layers.{i}"
        classes.update({layer: "LlamaDecoderLayer", f"{layer}.self_attn": "LlamaAttention",
                        f"{layer}.mlp": "LlamaMLP", f"{layer}.mlp.act_fn": "SiLU",
                        f"{layer}.input_layernorm": "LlamaRMSNorm",
                        f"{layer}.post_attention_layernorm": "LlamaRMSNorm"})
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            classes[f"{layer}.self_attn.{proj}"] = "Linear"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            classes[f"{layer}.mlp.{proj}"] = "Linear"
        where[0] = f"{layer}.input_layernorm"
        x = node("rms_norm", [h, param(f"{layer}.ln1", (d,))], {"normalized_shape": [d]})
        heads_of = {}
        for proj in ("q_proj", "k_proj", "v_proj"):
            where[0] = f"{layer}.self_attn.{proj}"
            y = node("linear", [x, param(f"{layer}.{proj}", (d, d))])
            where[0] = f"{layer}.self_attn"
            y = node("view", [y], {"shape": [1, t, heads, hd]})
            heads_of[proj] = node("transpose", [y], {"dim0": 1, "dim1": 2})
        for proj in ("q_proj", "k_proj"):   # rotary embedding: x * cos + rotate_half(x) * sin
            y = heads_of[proj]
            lo = node("slice", [y], {"dim": -1, "start": 0, "end": hd // 2})
            hi = node("slice", [y], {"dim": -1, "start": hd // 2, "end": hd})
            rot = node("cat", [node("neg", [hi]), lo], {"dim": -1})
            heads_of[proj] = node("add", [node("mul", [y, cos]), node("mul", [rot, sin])])
        a = node("scaled_dot_product_attention", [heads_of["q_proj"], heads_of["k_proj"], heads_of["v_proj"]],
                 {"is_causal": True})
        a = node("reshape", [node("transpose", [a], {"dim0": 1, "dim1": 2})], {"shape": [1, t, d]})
        where[0] = f"{layer}.self_attn.o_proj"
        a = node("linear", [a, param(f"{layer}.o_proj", (d, d))])
        where[0] = layer
        h = node("add", [h, a])
        where[0] = f"{layer}.post_attention_layernorm"
        x = node("rms_norm", [h, param(f"{layer}.ln2", (d,))], {"normalized_shape": [d]})
        where[0] = f"{layer}.mlp.gate_proj"
        g = node("linear", [x, param(f"{layer}.gate_proj", (2 * d, d))])
        where[0] = f"{layer}.mlp.act_fn"
        g = node("silu", [g])
        where[0] = f"{layer}.mlp.up_proj"
        u = node("linear", [x, param(f"{layer}.up_proj", (2 * d, d))])
        where[0] = f"{layer}.mlp"
        m = node("mul", [g, u])
        where[0] = f"{layer}.mlp.down_proj"
        m = node("linear", [m, param(f"{layer}.down_proj", (d, 2 * d))])
        where[0] = layer
        h = node("add", [h, m])
    where[0] = "model.norm"
    h = node("rms_norm", [h, param("norm", (d,))], {"normalized_shape": [d]})
    where[0] = "lm_head"
    p.mark_output(node("linear", [h, param("lm_head", (512, d))]))
    p.metadata["modules"] = {"nodes": paths, "classes": classes}
    return p


def cached_program_file(n_nodes: int) -> str:
    from agent_core.project_file import save_program
    folder = os.path.join(ROOT, "test-output", "bench")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"decoder_{n_nodes}.json")
    if not os.path.exists(path):
        save_program(decoder_program(n_nodes), path)
    return path


class Clock:
    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.w
        self.cpu = time.process_time() - self.c


def resnet101_file() -> str:
    from agent_core.project_file import save_program
    from tools.resnets import resnet_program
    path = os.path.join(ROOT, "test-output", "bench", "resnet101.json")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        save_program(resnet_program(101), path)
    return path


def bench_open(app, path: str, warm_path: str) -> dict:
    """Open through the main window as a user does (load, layout, scene, first paint): the first
    open in a fresh process (it pays one-time imports), then again after a small program was
    opened. load_s is agent_core.project_file.load_program alone; the editor's share is the rest."""
    from agent_core.project_file import load_program
    from app.main_window import MainWindow
    win = MainWindow(theme="dark", restore_settings=False)
    win.resize(1600, 1000)
    win.show()
    app.processEvents()
    out = {}
    for label in ("first_open", "warm_open"):
        if label == "warm_open":
            win.document.mark_clean()
            win.open_path(warm_path, layout_sync=True)
            win.document.mark_clean()
        with Clock() as c:
            win.open_path(path, layout_sync=True)
            win.view.viewport().repaint()
        out[label] = {"wall_s": round(c.wall, 3), "cpu_s": round(c.cpu, 3)}
    import gc
    gc.disable()
    with Clock() as c:
        load_program(path)
    gc.enable()
    out["nodes"] = len(win.document.program.nodes)
    out["load_program_cpu_s"] = round(c.cpu, 3)
    out["editor_cpu_s"] = round(out["warm_open"]["cpu_s"] - c.cpu, 3)
    win.document.mark_clean()
    win.close()
    return out


def bench_layout(path: str, grandalf: bool) -> dict:
    from agent_core.project_file import load_program
    from graph_editor.layout import LayoutInput, grandalf_layout, layered_layout
    from graph_editor.scene import program_layout_input
    p = load_program(path)
    full = program_layout_input(p)     # what the editor lays out: module boxes, collapsed units
    data = LayoutInput([n for n in full.nodes if n in p.nodes], full.sizes,
                       [(a, b) for a, b in full.edges if a in p.nodes], full.groups, {})
    out = {"nodes": len(p.nodes)}
    with Clock() as c:
        layered_layout(full)
    out["editor_layout_cpu_s"] = round(c.cpu, 3)
    out["editor_layout_wall_s"] = round(c.wall, 3)
    with Clock() as c:
        pos = layered_layout(data)
    out["own_cpu_s"] = round(c.cpu, 3)
    out["own_quality"] = layout_quality(data, pos)
    if grandalf:
        with Clock() as c:
            pos = grandalf_layout(data)
        out["grandalf_cpu_s"] = round(c.cpu, 3)
        out["grandalf_quality"] = layout_quality(data, pos)
    return out


def layout_quality(data, pos) -> dict:
    """Overlapping node pairs (must be 0), edges that neither run downwards nor start a column to the
    right (a wrapped layout), and the mean sideways bend of an edge in pixels (lower reads better)."""
    boxes = sorted((pos[n][0], pos[n][1], pos[n][0] + data.sizes[n][0], pos[n][1] + data.sizes[n][1])
                   for n in data.nodes if n in pos)
    overlaps = 0
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if b[0] >= a[2]:
                break
            if not (a[3] <= b[1] or b[3] <= a[1]):
                overlaps += 1
    backwards = sum(1 for a, b in data.edges
                    if pos[a][1] >= pos[b][1] and pos[a][0] + data.sizes[a][0] >= pos[b][0])
    bend = [abs((pos[a][0] + data.sizes[a][0] / 2) - (pos[b][0] + data.sizes[b][0] / 2)) for a, b in data.edges]
    return {"overlaps": overlaps, "backward_edges": backwards,
            "mean_edge_bend_px": round(sum(bend) / max(1, len(bend)), 1)}


def bench_paint(app, path: str) -> dict:
    """Zoom and pan steps with a synchronous repaint, at fit-all zoom and at working zooms."""
    from app.main_window import MainWindow
    win = MainWindow(theme="dark", restore_settings=False)
    win.resize(1600, 1000)
    win.show()
    win.open_path(path, layout_sync=True)
    app.processEvents()
    view = win.view
    out = {"nodes": len(win.document.program.nodes)}
    first = next(iter(win.scene.nodes.values()))
    for label, setup in (("fit_all", view.fit_all),
                         ("zoom_0.5", lambda: (view.resetTransform(), view.zoom_by(0.5), view.centerOn(first))),
                         ("zoom_1.0", lambda: (view.resetTransform(), view.zoom_by(1.0), view.centerOn(first)))):
        setup()
        view.viewport().repaint()
        zoom, pan = [], []
        for k in range(20):
            with Clock() as c:
                view.zoom_by(1.1 if k % 2 else 1 / 1.1)
                view.viewport().repaint()
            zoom.append(c)
        for k in range(20):
            with Clock() as c:
                view.pan(40 if k % 2 else -40, 25)
                view.viewport().repaint()
            pan.append(c)
        out[label] = {
            "zoom_ms_median_wall": round(1000 * statistics.median(x.wall for x in zoom), 2),
            "zoom_ms_median_cpu": round(1000 * statistics.median(x.cpu for x in zoom), 2),
            "zoom_ms_max_wall": round(1000 * max(x.wall for x in zoom), 2),
            "pan_ms_median_wall": round(1000 * statistics.median(x.wall for x in pan), 2),
            "pan_ms_median_cpu": round(1000 * statistics.median(x.cpu for x in pan), 2),
            "pan_ms_max_wall": round(1000 * max(x.wall for x in pan), 2),
        }
    win.document.mark_clean()
    win.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--open-nodes", type=int, default=5000)
    ap.add_argument("--paint-nodes", type=int, default=2000)
    ap.add_argument("--grandalf", action="store_true", help="also time grandalf's Sugiyama layout")
    ap.add_argument("--grandalf-nodes", type=int, default=1000)
    args = ap.parse_args(argv)
    from PySide6.QtCore import QStandardPaths
    from PySide6.QtWidgets import QApplication
    QStandardPaths.setTestModeEnabled(True)  # no settings or recovery files in the user's profile
    app = QApplication.instance() or QApplication([])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
              "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    open_path = cached_program_file(args.open_nodes)
    paint_path = cached_program_file(args.paint_nodes)
    result["open"] = bench_open(app, open_path, cached_program_file(200))
    result["paint"] = bench_paint(app, paint_path)
    result["layout"] = bench_layout(open_path, grandalf=False)
    resnet = resnet101_file()
    result["resnet101_open"] = bench_open(app, resnet, cached_program_file(200))
    result["resnet101_paint"] = bench_paint(app, resnet)
    result["resnet101_layout"] = bench_layout(resnet, grandalf=False)
    if args.grandalf:
        result["layout_small"] = bench_layout(cached_program_file(args.grandalf_nodes), grandalf=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
