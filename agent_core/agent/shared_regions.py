"""Regions that run the same kernel on the same shapes are verified, tuned and timed once.

A model repeats its blocks (ResNet's bottlenecks, an RNN cell unrolled over time steps), and the
planner gives each repetition its own region with a kernel that differs only in names. Such regions
have one *signature* (region_signature): the kernel's canonical text (canonical_source: names and
comments dropped) and launch configuration, and the region's ops, attributes, library-call precision
forms and value specs written against local positions instead of value ids. Two regions with one
signature compute the same function of their inputs with the same code, so the first one's
measurements (its time, its ops' time, its tuning trials) are theirs, and its verdict on five random
draws is the verdict on that code.

What is still checked per region, because it depends on the region's own place in the program:
- a shared pass is confirmed on one draw of the region's own reference inputs (the reference cache
  already holds it); a region that fails that check is optimized on its own, from the start;
- the end-to-end program is verified on every draw with every kept kernel, as before, and a kernel
  that breaks it is found by bisection (loop._without_culprits).
Regions with integer or boolean inputs (indices, masks: their values decide what the code reads) are
never shared, nor outcomes that changed the program on the way (a library call sent back to fp32, the
attention kernel's exact form), nor failures of loading or timing.
"""
from __future__ import annotations

import hashlib
import json

from ..canonical_source import canonical_form
from ..codegen import region_io
from ..runtime.split_tf32 import library_layout, library_precision
from .phases import phase
from .tune import tune_space

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
OWN_CHECK_DRAWS = 1      # draws of a region's own inputs that confirm a shared pass


def _attrs(attrs: dict) -> str:
    return json.dumps(attrs, sort_keys=True, default=repr)


def region_signature(program, node_ids, ks) -> str | None:
    """A hash equal for two regions exactly when their kernels and what they compute are the same up
    to names, or None when the region must not share (its kernel has no canonical form, an input is
    an integer or boolean tensor)."""
    form = canonical_form(ks.source, ks.name)
    if form is None:
        return None
    io = region_io(program, node_ids)
    local: dict[str, str] = {}
    inputs = []
    for i, vid in enumerate(io.inputs):
        v = program.values[vid]
        if v.dtype not in FLOAT_DTYPES:
            return None
        local[vid] = f"i{i}"
        # strides need no place here: a kernel's inputs reach it contiguous and aligned (runtime.launch,
        # program_runtime.executable copy those that are not) and library calls take any layout
        inputs.append((list(v.shape), v.dtype))
    forms, layouts = library_precision(program), library_layout(program)
    nodes = []
    for j, nid in enumerate(io.nodes):
        n = program.nodes[nid]
        refs = [local.get(v, "?") if v else None for v in n.inputs]
        for k, o in enumerate(n.outputs):
            local[o] = f"n{j}.{k}"
        outs = [(list(program.values[o].shape), program.values[o].dtype) for o in n.outputs]
        call = forms.get(nid) if nid not in layouts else f"{forms.get(nid) or 'fp32'}+{layouts[nid]}"
        nodes.append((n.op, _attrs(n.attrs), refs, outs, call))
    if any("?" in (n[2] or ()) for n in nodes):
        return None
    try:
        kernel_io = ([local[v] for v in ks.inputs], [local[v] for v in ks.outputs],
                     [io.nodes.index(n) for n in ks.library_nodes])
        outputs = [local[v] for v in io.outputs]
    except (KeyError, ValueError):
        return None
    launch = (ks.kind, list(ks.grid), list(ks.block), ks.shared_bytes, ks.align, [list(w) for w in ks.workspace],
              _attrs(ks.params))
    text = json.dumps([form.text, launch, inputs, nodes, kernel_io, outputs], default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _final_form(ks) -> str | None:
    form = canonical_form(ks.source, ks.name)
    return None if form is None else form.text


class SharedRegions:
    """The outcome of the first region of each signature, handed to the others (agent._on_gpu's
    caller: run() takes its place). `stats` counts what was measured and what was shared."""

    def __init__(self):
        self.entries: dict[str, dict] = {}
        self.members: dict[str, list[str]] = {}     # signature -> region ids that used it
        self.stats = {"measured": 0, "shared": 0, "own_check_failed": 0, "not_shared": 0}
        self._ahead: dict[str, tuple] | None = None   # region id -> (its prefetched kernel, signature)
        self._counts: dict[str, int] = {}             # signature -> regions of the plan that have it

    @staticmethod
    def _signature(program, nodes, ks) -> str | None:
        try:
            return region_signature(program, nodes, ks)
        except Exception:       # a signature that cannot be written only means no sharing
            return None

    def _look_ahead(self, agent) -> None:
        """Signatures of every region's default kernel that agent.prefetch generated: how many regions
        each signature has (group_size), computed once, when the first region reaches the GPU."""
        self._ahead = {}
        pre = getattr(agent, "prefetch", None)
        if pre is None:
            return
        regions = {r.id: r for r in agent.program.regions}
        for (rid, _name, params), ks in list(pre.kernels.items()):
            if params or isinstance(ks, Exception) or rid not in regions:
                continue
            key = self._signature(agent.program, regions[rid].nodes, ks)
            self._ahead[rid] = (ks, key)
            if key is not None:
                self._counts[key] = self._counts.get(key, 0) + 1

    def group_size(self, r) -> int:
        """How many regions of the plan run the same kernel on the same shapes as region r (1 when
        unknown): what tuning it once is worth."""
        got = (self._ahead or {}).get(r.id)
        return max(1, self._counts.get(got[1], 1)) if got and got[1] else 1

    def run(self, agent, r, out, ks, c):
        """(outcome, kept) for region r, whose default kernel ks compiled as c: the shared outcome of its
        signature, or agent._on_gpu's (then remembered for the next regions of the signature)."""
        if self._ahead is None:
            self._look_ahead(agent)
        got = self._ahead.get(r.id)
        if got is not None and got[0] is ks:
            key = got[1]
        else:      # not prefetched (the first region's was taken before the look-ahead)
            key = self._signature(agent.program, r.nodes, ks)
            if got is None and key is not None:
                self._counts[key] = self._counts.get(key, 0) + 1
            self._ahead[r.id] = (ks, key)
        if key is None:
            self.stats["not_shared"] += 1
            return agent._on_gpu(r, out, ks, c)
        self.members.setdefault(key, []).append(r.id)
        entry = self.entries.get(key)
        if entry is not None:
            got = self._reuse(agent, r, out, ks, entry)
            if got is not None:
                self.stats["shared"] += 1
                return got
            self.stats["own_check_failed"] += 1
        before = {n: library_precision(agent.program).get(n) for n in ks.library_nodes}
        o, kept = agent._on_gpu(r, out, ks, c)
        self.stats["measured"] += 1
        if entry is None:
            e = self._entry(agent, r, o, kept, ks, before)
            if e is not None:
                self.entries[key] = e
        return o, kept

    # --- what is remembered ------------------------------------------------------------------
    @staticmethod
    def _entry(agent, r, o, kept, ks, before) -> dict | None:
        after = {n: library_precision(agent.program).get(n) for n in ks.library_nodes}
        if after != before:          # a library call went back to fp32 on the way: that is this region's story
            return None
        final = agent.kernels.get(r.id)
        if final is not None and final is not ks and _final_form(final) is None:
            return None
        base = {"region": r.id, "status": o.status, "reason": o.reason, "fused_ms": o.fused_ms,
                "unfused_ms": o.unfused_ms, "params": dict(o.params), "attribution": dict(o.attribution)}
        if o.status == "fused" and kept is not None:
            best = kept[1]
            trial = _best_trial(o)
            if trial is None and best.source != ks.source:
                return None          # kept a kernel that no tuning trial names (the exact attention form)
            return {**base, "kind": "pass", "trial": trial or 0, "form": _final_form(best)}
        if o.status == "fallback" and o.reason.startswith("correct but not faster"):
            return {**base, "kind": "slower"}
        if o.status == "fallback" and o.reason.startswith(("verification failed", "the tuned kernel failed")):
            if final is not None and final.source != ks.source:
                return None          # the failure is another form's (attention's exact form)
            return {**base, "kind": "fail"}
        return None

    # --- what is handed out ------------------------------------------------------------------
    def _reuse(self, agent, r, out, ks, entry):
        rep = entry["region"]
        same = f"the same kernel on the same shapes as region {rep}"
        if entry["kind"] == "fail":
            why = entry["reason"].split(": ", 1)[-1]
            out.reason = f"verification failed ({same}, verified there): {why}"
            return agent._finish(r, out), None
        if entry["kind"] == "slower":
            out.fused_ms, out.unfused_ms = entry["fused_ms"], entry["unfused_ms"]
            out.reason = f"{entry['reason']} (timed as {same})"
            return agent._finish(r, out), None
        return self._reuse_pass(agent, r, out, ks, entry, same)

    def _reuse_pass(self, agent, r, out, ks, entry, same):
        from ..compiler import compile_kernel
        from ..runtime.launch import load_kernel
        best = ks
        try:
            if entry["trial"]:
                sm = int(agent.hw.get("sm_count") or 132)
                space = tune_space(ks, sm_count=sm, limit=agent.tune_trials)
                if entry["trial"] > len(space):
                    return None
                best = agent._generate(r, ks.name, space[entry["trial"] - 1])
            if _final_form(best) != entry["form"]:
                return None
            with phase("compile"):
                c = compile_kernel(best, arch=agent.arch)
            with phase("load"):
                loaded = load_kernel(best, agent.program, c)
        except Exception:     # this region then goes its own way
            return None
        runner = agent._runner(r, best, loaded)
        check = agent._verify(r, runner, OWN_CHECK_DRAWS, f"shared with region {entry['region']}")
        if not check.ok:
            return None
        r.source = best.source
        agent.kernels[r.id] = best
        out.source_path = agent._write_source(best)
        out.status = "fused"
        out.fused_ms, out.unfused_ms = entry["fused_ms"], entry["unfused_ms"]
        out.params, out.attribution = dict(entry["params"]), dict(entry["attribution"])
        out.reason = (f"{same}, measured there: {entry['reason']}; this region's own inputs checked on "
                      f"{OWN_CHECK_DRAWS} draw")
        if out.fused_ms is not None:
            agent.ev.emit("profile", scope="region", region=r.id, kernel=best.name, ms=out.fused_ms,
                          unfused_ms=out.unfused_ms, shared_with=entry["region"])
        return agent._finish(r, out), (list(r.nodes), best, loaded)

    def summary(self) -> dict:
        groups = [m for m in self.members.values() if len(m) > 1]
        return {**self.stats, "signatures": len(self.members), "repeated_signatures": len(groups),
                "regions_in_repeats": sum(len(m) for m in groups)}


def _best_trial(o) -> int | None:
    """The tuning trial whose kernel was kept: the last one marked best (0: the default)."""
    best = None
    for t in o.trials:
        if t.get("trial") == 0 or t.get("best"):
            best = t.get("trial")
    return best
