"""The project file: exact round trips, atomic saves, and a precise error for every kind of bad file."""
from __future__ import annotations

import base64
import copy
import json
import os

import numpy as np
import pytest

from agent_core import project_file as pf
from agent_core.errors import FileFormatError
from agent_core.ir import Program
from agent_core.project_file import (dumps, load_program, loads, program_from_json, program_to_json,
                                     save_program)


def make_program(big: bool = True) -> Program:
    """x -> add(w) -> relu -> mul(x) with an inline weight, a special-value constant and (big) a
    parameter large enough for the sidecar."""
    p = Program("demo")
    x = p.add_input("x", (4, 8), init={"kind": "uniform", "low": -1.0, "high": 2.5})
    w = p.add_parameter("w", np.arange(32, dtype=np.float32).reshape(4, 8) / 7)
    c = p.add_parameter("c", np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.0, 0.0, 1.0], np.float32),
                        constant=True)
    a = p.add_node("add", [x.id, w.id], pos=(10.0, -20.5))
    r = p.add_node("leaky_relu", [a.outputs[0]], {"negative_slope": 0.2})
    m = p.add_node("mul", [r.outputs[0], c.id])
    if big:
        b = p.add_parameter("b", np.random.default_rng(0).standard_normal((64, 80)).astype(np.float64))
        s = p.add_node("sum", [b.id]) if "sum" in _ops() else None
        if s is not None:
            p.mark_output(s.outputs[0])
    p.mark_output(m.outputs[0])
    p.set_pos(m.id, (300.25, 40.0))
    p.log.append({"actor": "planner", "action": "propose", "message": "fuse add+relu", "t": float("inf")})
    p.profile = {"total_ms": 0.125, "kernels": [{"name": "k0", "ms": 0.1}], "nan": float("nan")}
    p.metadata.update({"source": "hand-made", "warnings": [], "nested": {"a": [1, 2, {"b": None}]}})
    return p


def _ops():
    from agent_core.ops import REGISTRY
    return REGISTRY


def saved(tmp_path, p=None, name="prog.json"):
    path = tmp_path / name
    save_program(p or make_program(), path)
    return path


def doc(tmp_path, p=None) -> dict:
    """A saved file's JSON, for tests that damage it."""
    return json.loads(saved(tmp_path, p or make_program(big=False)).read_text())


def load_obj(tmp_path, obj, name="bad.json") -> Program:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return load_program(path)


def error_of(tmp_path, obj) -> str:
    with pytest.raises(FileFormatError) as e:
        load_obj(tmp_path, obj)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --- round trips -----------------------------------------------------------------------------
def test_round_trip_is_exact_with_inline_and_sidecar_data(tmp_path):
    p = make_program()
    path = saved(tmp_path, p)
    assert (tmp_path / "prog.json.npz").is_file()
    q = load_program(path)
    assert program_to_json(q) == program_to_json(p)
    assert q is not p and q.nodes.keys() == p.nodes.keys()
    for vid, arr in p.data.items():
        assert q.data[vid].dtype == arr.dtype and q.data[vid].shape == arr.shape
        assert q.data[vid].tobytes() == arr.tobytes()  # bit-exact: NaN, inf, -0.0, denormals
    assert q.nodes[list(p.nodes)[0]].pos == (10.0, -20.5)
    assert q.values[p.inputs[0]].init == {"kind": "uniform", "low": -1.0, "high": 2.5}
    assert np.isnan(q.profile["nan"]) and q.log[0]["t"] == float("inf")
    # a second save of the loaded program writes the same bytes
    save_program(q, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text().replace("again.json", "prog.json") == path.read_text()
    # the ids keep counting from where the saved program stopped
    assert q._next_id == p._next_id
    assert q.add_input("y", (2,)).id not in p.values


def test_file_is_strict_json_with_one_entry_per_line(tmp_path):
    text = saved(tmp_path).read_text()
    obj = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard constant {c}"))
    assert obj["format"] == "stitchcuda-program" and obj["schema_version"] == 1
    assert len(text.splitlines()) < 40
    inline = [e for e in obj["parameters"] if "data" in e]
    side = [e for e in obj["parameters"] if "sidecar" in e]
    assert all(int(np.prod(e["shape"])) <= pf.INLINE_LIMIT for e in inline) and len(side) == 1
    assert side[0]["sidecar"] == "prog.json.npz" and len(side[0]["sha256"]) == 64


def test_sidecar_is_a_plain_npz_without_pickle(tmp_path):
    p = make_program()
    saved(tmp_path, p)
    with np.load(tmp_path / "prog.json.npz", allow_pickle=False) as z:
        vid = next(v for v, a in p.data.items() if a.size > pf.INLINE_LIMIT)
        (key,) = z.files  # "<value id>.<checksum prefix>"
        assert key.startswith(vid + ".") and np.array_equal(z[key], p.data[vid])


def test_regions_log_profile_and_positions_round_trip(tmp_path):
    p = make_program(big=False)
    first, second = list(p.nodes)[:2]
    region = {"id": "r1", "kind": "pointwise", "nodes": [first, second], "status": "locked",
              "reason": "add feeds relu only", "est_before_ms": 0.02, "est_after_ms": 0.01,
              "measured_ms": None, "source": "__global__ void k() {}\n", "log": [{"actor": "user"}],
              "schedule": {"block": 256}}
    try:
        from agent_core.regions import Region
        p.regions.append(Region.from_dict(region))
    except ImportError:
        p.regions.append(region)
    q = load_program(saved(tmp_path, p))
    assert program_to_json(q) == program_to_json(p)
    r = q.regions[0]
    r = r.to_dict() if hasattr(r, "to_dict") else r
    assert r["nodes"] == [first, second] and r["status"] == "locked" and r["source"].startswith("__global__")


def test_clipboard_text_round_trips_everything_inline(tmp_path):
    p = make_program()
    text = dumps(p)
    assert "sidecar" not in text and "\n" not in text
    assert program_to_json(loads(text)) == program_to_json(p)


def test_unconnected_ports_of_a_half_built_graph_load_with_node_errors(tmp_path):
    p = Program("wip")
    x = p.add_input("x", (3,))
    n = p.add_node("add", [x.id, None], strict=False)
    p.mark_output(n.outputs[0])
    q = load_program(saved(tmp_path, p))
    assert q.nodes[n.id].error and "not connected" in q.nodes[n.id].error
    with pytest.raises(FileFormatError, match="not connected"):
        load_program(tmp_path / "prog.json", strict=True)


def test_saving_again_without_large_parameters_removes_the_stale_sidecar(tmp_path):
    path = saved(tmp_path, make_program())
    save_program(make_program(big=False), path)
    assert not (tmp_path / "prog.json.npz").exists()
    load_program(path)


# --- atomic saves ----------------------------------------------------------------------------
def test_a_crash_mid_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = saved(tmp_path)
    before = {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)}
    p = make_program()
    p.name = "changed"
    p.data[next(v for v, a in p.data.items() if a.size > pf.INLINE_LIMIT)] *= 2  # new sidecar too

    def crash(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(pf.os, "fsync", crash)
    with pytest.raises(OSError, match="No space"):
        save_program(p, path)
    after = {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)}
    assert after == before  # old files whole, no temporary files left behind
    assert load_program(path).name == "demo"


def test_a_crash_while_writing_the_json_keeps_the_old_json(tmp_path, monkeypatch):
    path = saved(tmp_path, make_program(big=False))
    old = path.read_bytes()
    calls = []
    real_replace = os.replace

    def replace(src, dst):
        calls.append(dst)
        raise KeyboardInterrupt  # killed just before the rename
    monkeypatch.setattr(pf.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        save_program(make_program(big=False), path)
    monkeypatch.setattr(pf.os, "replace", real_replace)
    assert calls and path.read_bytes() == old
    assert os.listdir(tmp_path) == ["prog.json"]


def test_a_crash_between_the_sidecar_and_the_json_rename_keeps_a_loadable_pair(tmp_path, monkeypatch):
    p = make_program()
    path = saved(tmp_path, p)
    vid = next(v for v, a in p.data.items() if a.size > pf.INLINE_LIMIT)
    q = make_program()
    q.data[vid] = q.data[vid] * 2
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith(".json"):
            raise KeyboardInterrupt  # killed after the sidecar's rename, before the JSON's
        real_replace(src, dst)
    monkeypatch.setattr(pf.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        save_program(q, path)
    monkeypatch.setattr(pf.os, "replace", real_replace)
    assert np.array_equal(load_program(path).data[vid], p.data[vid])  # the old pair still loads
    save_program(q, path)
    assert np.array_equal(load_program(path).data[vid], q.data[vid])
    with np.load(tmp_path / "prog.json.npz", allow_pickle=False) as z:
        assert len(z.files) == 2  # this save's array and the one the previous file read
    save_program(load_program(path), path)  # unchanged: the sidecar is not rewritten
    r = load_program(path)
    r.data[vid] = r.data[vid] + 1
    save_program(r, path)
    with np.load(tmp_path / "prog.json.npz", allow_pickle=False) as z:
        assert len(z.files) == 2  # arrays older than the file on disk are dropped


def test_save_refuses_what_a_file_cannot_hold(tmp_path):
    p = make_program(big=False)
    p.metadata["obj"] = object()
    with pytest.raises(FileFormatError, match="metadata.obj: an object is not plain data"):
        save_program(p, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()
    p = make_program(big=False)
    p.data[p.inputs[0]] = np.zeros((4, 8), np.float32)
    with pytest.raises(FileFormatError, match="which is an input"):
        save_program(p, tmp_path / "x.json")


# --- bad files: each gives its own message ----------------------------------------------------
def test_not_json_truncated_empty_and_binary(tmp_path):
    path = saved(tmp_path, make_program(big=False))
    text = path.read_text()
    (tmp_path / "t.json").write_text(text[: len(text) // 2])
    with pytest.raises(FileFormatError, match=r"not valid JSON \(the file is truncated\)"):
        load_program(tmp_path / "t.json")
    (tmp_path / "e.json").write_text("  \n")
    with pytest.raises(FileFormatError, match="the file is empty"):
        load_program(tmp_path / "e.json")
    (tmp_path / "b.json").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(FileFormatError, match="not UTF-8 text"):
        load_program(tmp_path / "b.json")
    (tmp_path / "n.json").write_text('{"format": NaN}')
    with pytest.raises(FileFormatError, match="NaN is not JSON"):
        load_program(tmp_path / "n.json")
    (tmp_path / "d.json").write_text('{"format": 1, "format": 2}')
    with pytest.raises(FileFormatError, match="key 'format' appears twice"):
        load_program(tmp_path / "d.json")
    with pytest.raises(FileFormatError, match="no such file"):
        load_program(tmp_path / "missing.json")
    with pytest.raises(FileFormatError, match="is a folder"):
        load_program(tmp_path)
    if os.path.exists("/dev/zero"):
        with pytest.raises(FileFormatError, match="not a regular file"):
            load_program("/dev/zero")


def test_wrong_format_tag_and_versions(tmp_path):
    obj = doc(tmp_path)
    assert "not a StitchCUDA program file (format 'onnx'" in error_of(tmp_path, {**obj, "format": "onnx"})
    assert "no 'format' key" in error_of(tmp_path, {k: v for k, v in obj.items() if k != "format"})
    assert "a project file is a JSON object, got a list" in error_of(tmp_path, [obj])
    msg = error_of(tmp_path, {**obj, "schema_version": 7})
    assert "schema version 7, written by a newer StitchCUDA; this one reads up to version 1" in msg
    assert "schema_version: must be an integer, got a string" in error_of(tmp_path, {**obj, "schema_version": "1"})


@pytest.mark.parametrize("damage, expected", [
    (lambda o: o.pop("nodes"), "missing key 'nodes'"),
    (lambda o: o.update(extra=1), "unknown key 'extra'"),
    (lambda o: o["nodes"][1].pop("attrs"), "nodes[1]: missing key 'attrs'"),
    (lambda o: o.update(nodes={}), "nodes: must be a list, got an object"),
    (lambda o: o["nodes"][0].update(inputs="v1"), "nodes[0].inputs: must be a list, got a string"),
    (lambda o: o["values"][0].update(shape=[4, "8"]), "values[0].shape[1]: a dimension must be an integer, got a string"),
    (lambda o: o["values"][0].update(shape=[4, 8.0]), "values[0].shape[1]: a dimension must be an integer, got a number"),
    (lambda o: o["values"][0].update(shape=[4, True]), "values[0].shape[1]: a dimension must be an integer, got a boolean"),
    (lambda o: o["values"][0].update(dtype="float8"), "values[0].dtype: unknown dtype 'float8'"),
    (lambda o: o["values"][0].update(role="weight"), "values[0].role: unknown role 'weight'"),
    (lambda o: o["nodes"][1].update(name=7), "nodes[1].name: must be a string, got an integer"),
    (lambda o: o["nodes"][1].update(attrs={"negative_slope": "big"}), "nodes[1].attrs: attribute leaky_relu.negative_slope must be a number"),
    (lambda o: o["nodes"][1].update(attrs={"alpha": 1.0}), "nodes[1].attrs: leaky_relu has no attribute alpha"),
    (lambda o: o["nodes"][0].update(pos=[1.0]), "nodes[0].pos: must be [x, y] with two finite numbers"),
    (lambda o: o.update(next_id=-3), "next_id: -3 is out of range"),
    (lambda o: o.update(next_id=2), "next_id: 2 is below an id already in use"),
    (lambda o: o.update(name=None), "name: must be a string, got null"),
])
def test_wrong_types_and_missing_keys_name_the_path(tmp_path, damage, expected):
    obj = doc(tmp_path)
    damage(obj)
    assert expected in error_of(tmp_path, obj)


def test_unknown_op(tmp_path):
    obj = doc(tmp_path)
    obj["nodes"][1]["op"] = "leaky_relux"
    assert "nodes[1].op: unknown op 'leaky_relux'; did you mean leaky_relu" in error_of(tmp_path, obj)
    obj["nodes"][1]["op"] = "__import__('os').system('rm -rf /')"
    assert "nodes[1].op: unknown op" in error_of(tmp_path, obj)


def test_dangling_references(tmp_path):
    obj = doc(tmp_path)
    o = copy.deepcopy(obj)
    o["nodes"][2]["inputs"][1] = "v99"
    assert "nodes[2].inputs[1]: refers to unknown value 'v99'" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["outputs"] = ["v42"]
    assert "outputs[0]: refers to unknown value 'v42'" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["values"][-1]["producer"] = "n77"
    assert "refers to unknown node 'n77'" in error_of(tmp_path, o) or "names producer" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["parameters"][0]["value"] = "v1"
    assert "parameters[0].value: 'v1' is an input; only parameters and constants hold data" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["inputs"] = []
    assert "inputs: input value 'v1' is not listed" in error_of(tmp_path, o)


def test_duplicate_ids(tmp_path):
    obj = doc(tmp_path)
    o = copy.deepcopy(obj)
    o["nodes"].append(copy.deepcopy(o["nodes"][0]))
    assert "nodes[3].id: duplicate node id" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["values"].append(copy.deepcopy(o["values"][0]))
    assert f"values[{len(obj['values'])}].id: duplicate value id 'v1'" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["nodes"][0]["id"] = "v1"
    assert "nodes[0].id: 'v1' is already the id of a value" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["inputs"] = ["v1", "v1"]
    assert "inputs[1]: 'v1' is listed twice" in error_of(tmp_path, o)


def test_a_cycle_gets_its_own_message(tmp_path):
    p = Program("loop")
    x = p.add_input("x", (4,))
    a = p.add_node("relu", [x.id], name="first")
    b = p.add_node("sigmoid", [a.outputs[0]], name="second")
    p.mark_output(b.outputs[0])
    obj = program_to_json(p)
    obj["nodes"][0]["inputs"] = [b.outputs[0]]  # first reads second's output
    msg = error_of(tmp_path, obj)
    assert "nodes: the program has a cycle: first -> second -> first" in msg
    obj["nodes"][0]["inputs"] = [a.outputs[0]]  # a node reading itself
    assert "cycle" in error_of(tmp_path, obj)


def test_absurd_shapes_and_huge_strings(tmp_path):
    obj = doc(tmp_path)
    o = copy.deepcopy(obj)
    o["values"][0]["shape"] = [1000000, 1000000, 1000]
    assert "values[0].shape: shape [1000000, 1000000, 1000] has 1e+15 elements" in error_of(tmp_path, o)
    o["values"][0]["shape"] = [4, -8]
    assert "values[0].shape[1]: negative dimension -8" in error_of(tmp_path, o)
    o["values"][0]["shape"] = [1] * 100
    assert "values[0].shape: 100 entries is more than the 32 allowed" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["values"][0]["name"] = "x" * 5_000_000
    assert "values[0].name: a string of 5000000 characters is longer than the 1000 allowed" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["nodes"][0]["id"] = "n1; rm -rf"
    assert "nodes[0].id: 'n1; rm -rf' is not a valid id" in error_of(tmp_path, o)


def test_deep_nesting(tmp_path):
    obj = doc(tmp_path)
    deep: object = 1
    for _ in range(100):
        deep = [deep]
    obj["metadata"] = {"deep": deep}
    assert "nested deeper than 64 levels" in error_of(tmp_path, obj)
    (tmp_path / "deeper.json").write_text('{"format": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(FileFormatError, match="nested too deeply|not a StitchCUDA"):
        load_program(tmp_path / "deeper.json")


def test_inline_data_of_the_wrong_size_or_type(tmp_path):
    obj = doc(tmp_path)
    entry = obj["parameters"][0]
    o = copy.deepcopy(obj)
    o["parameters"][0]["data"] = base64.b64encode(b"\0" * 12).decode()
    assert "parameters[0].data: 16 base64 characters, expected 172 for float32[4, 8] (128 bytes)" in error_of(tmp_path, o)
    o["parameters"][0]["data"] = "!" * len(entry["data"])
    assert "parameters[0].data: is not valid base64" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["parameters"][0]["dtype"] = "object"
    assert "parameters[0].dtype: unknown dtype 'object'" in error_of(tmp_path, o)
    o = copy.deepcopy(obj)
    o["parameters"][0]["shape"] = [8, 4]
    assert "parameters[0].shape: [8, 4] does not match value" in error_of(tmp_path, o)


def test_stored_arrays_are_read_straight_from_the_file_and_still_crc_checked(tmp_path):
    """load_program(checksums=False), the import's private hand-off, reads each stored array straight
    into place and still checks the member's CRC-32: one flipped bit of the data is a damaged sidecar."""
    p = make_program()
    path = saved(tmp_path, p)
    vid = next(v for v, a in p.data.items() if a.size > pf.INLINE_LIMIT)
    assert np.array_equal(load_program(path, checksums=False).data[vid], p.data[vid])
    side = tmp_path / "prog.json.npz"
    blob = bytearray(side.read_bytes())
    at = bytes(blob).find(p.data[vid].tobytes()[:64])
    assert at > 0
    blob[at + 1000] ^= 1
    side.write_bytes(bytes(blob))
    with pytest.raises(FileFormatError, match="sidecar file 'prog.json.npz' is damaged: Bad CRC-32"):
        load_program(path, checksums=False)


def test_sidecar_missing_damaged_mismatched_or_holding_objects(tmp_path):
    p = make_program()
    path = saved(tmp_path, p)
    side = tmp_path / "prog.json.npz"
    good = side.read_bytes()
    vid = next(v for v, a in p.data.items() if a.size > pf.INLINE_LIMIT)
    with np.load(side, allow_pickle=False) as z:
        (key,) = z.files

    side.unlink()
    with pytest.raises(FileFormatError, match="sidecar file 'prog.json.npz' with the large parameters is missing"):
        load_program(path)
    side.write_bytes(good[: len(good) // 2])
    with pytest.raises(FileFormatError, match="sidecar file 'prog.json.npz' is damaged"):
        load_program(path)

    arr = p.data[vid].copy()
    arr[0, 0] += 1
    np.savez(side, **{key: arr})
    with pytest.raises(FileFormatError, match="does not match the file's checksum"):
        load_program(path)
    np.savez(side, **{key: arr.astype(np.float32)})
    with pytest.raises(FileFormatError, match=r"is float32\[64, 80\], the file says float64\[64, 80\]"):
        load_program(path)
    np.savez(side, other=arr)
    with pytest.raises(FileFormatError, match=f"has no array for '{vid}'"):
        load_program(path)
    objs = np.empty((64, 80), dtype=object)
    np.savez(side, **{key: objs})
    with pytest.raises(FileFormatError, match="holds Python objects; refusing to load it"):
        load_program(path)

    side.write_bytes(good)
    obj = json.loads(path.read_text())
    obj["parameters"][-1]["sidecar"] = "../../etc/passwd"
    with pytest.raises(FileFormatError, match="must be a plain file name next to the project file"):
        load_obj(tmp_path, obj)
    with pytest.raises(FileFormatError, match="which text alone cannot carry"):
        loads(path.read_text())
    assert program_to_json(load_program(path)) == program_to_json(p)


def test_bad_regions_are_refused(tmp_path):
    pytest.importorskip("agent_core.regions")
    obj = doc(tmp_path)
    first = obj["nodes"][0]["id"]
    o = copy.deepcopy(obj)
    o["regions"] = [{"id": "r1", "kind": "teleport", "nodes": [first]}]
    assert "regions[0]: not a valid region: region r1: unknown kind 'teleport'" in error_of(tmp_path, o)
    o["regions"] = [{"id": "r1", "kind": "pointwise", "nodes": "n1"}]
    assert "regions[0]: not a valid region: region r1: nodes must be a list of node ids" in error_of(tmp_path, o)


def test_regions_that_no_longer_fit_are_dropped_and_logged_or_refused_when_strict(tmp_path):
    """Deleting a region's node in the editor and saving must not make the file unloadable."""
    from agent_core.regions import Region
    p = make_program(big=False)
    a, r, m = list(p.nodes)
    p.remove_node(r)
    p.set_input(m, 0, p.nodes[a].outputs[0])
    # a file written by a tool that left r1 naming the deleted node (remove_node itself drops it)
    p.regions = [Region("r1", "pointwise", [a, r]), Region("r2", "pointwise", [m])]
    path = saved(tmp_path, p)
    q = load_program(path)
    assert [x.id for x in q.regions] == ["r2"]
    assert q.log[-1]["action"] == "drop-region" and "region r1 no longer fits the program and was dropped: " \
        f"refers to unknown node '{r}'" == q.log[-1]["message"]
    with pytest.raises(FileFormatError, match=rf"regions\[0\].nodes\[1\]: refers to unknown node '{r}'"):
        load_program(path, strict=True)

    p = make_program(big=False)
    a, r, m = list(p.nodes)
    p.regions = [Region("r1", "pointwise", [a, r]), Region("r2", "pointwise", [r, m])]
    save_program(p, path)
    assert [x.id for x in load_program(path).regions] == ["r1"]
    with pytest.raises(FileFormatError, match=r"regions\[1\]: .* is in both region r1 and region r2"):
        load_program(path, strict=True)

    p.regions = [Region("r1", "pointwise", [a, m])]  # skips relu in between: not convex
    save_program(p, path)
    assert load_program(path).regions == []
    with pytest.raises(FileFormatError, match=r"regions\[0\]: r1: "):
        load_program(path, strict=True)


def test_loading_leaves_the_callers_program_untouched(tmp_path):
    p = make_program(big=False)
    before = program_to_json(p)
    obj = program_to_json(p)
    obj["nodes"][2]["inputs"][1] = "v99"
    with pytest.raises(FileFormatError):
        program_from_json(obj)
    assert program_to_json(p) == before


def test_random_damage_only_ever_raises_file_format_error(tmp_path):
    """Truncations, flipped bytes and swapped JSON values: a clean error or a valid program, never a
    crash of another kind."""
    text = saved(tmp_path, make_program(big=False)).read_text()
    rng = np.random.default_rng(7)
    obj = json.loads(text)
    junk = [None, True, -1, 0, 2 ** 70, 1.5, "", "v1", "n1", [], {}, [None], {"$float": "nan"}, "x" * 300]
    cases = [text[:k] for k in range(0, len(text), max(1, len(text) // 60))]
    for _ in range(120):
        b = bytearray(text.encode())
        for i in rng.integers(0, len(b), size=3):
            b[i] = int(rng.integers(32, 127))
        cases.append(b.decode("utf-8", "replace"))
    paths = []

    def walk(x, path):
        paths.append(path)
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for k, v in items:
            walk(v, path + [k])
    walk(obj, [])
    for path in paths[1:]:
        o = copy.deepcopy(obj)
        parent = o
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = junk[int(rng.integers(len(junk)))]
        cases.append(json.dumps(o))
    failures = 0
    for text_case in cases:
        try:
            loads(text_case)
        except FileFormatError as e:
            assert "\n" not in str(e)
            failures += 1
    assert failures > len(cases) // 2


def test_opaque_nodes_round_trip_and_a_hostile_target_is_never_called(tmp_path):
    p = Program("with_opaque")
    x = p.add_input("x", (1, 2, 3, 4))
    n = p.add_node("opaque", [x.id], {"target": "aten.upsample_nearest2d.vec",
                                      "args": [{"input": 0}, [6, 8], None], "kwargs": {"note": float("-inf")},
                                      "out_specs": [{"shape": [1, 2, 6, 8], "dtype": "float32"}]})
    p.mark_output(n.outputs[0])
    q = load_program(saved(tmp_path, p))
    assert program_to_json(q) == program_to_json(p)
    assert q.nodes[n.id].attrs["kwargs"]["note"] == float("-inf") and q.nodes[n.id].error is None

    obj = program_to_json(p)
    obj["nodes"][0]["attrs"]["target"] = "os.system"
    obj["nodes"][0]["attrs"]["args"] = ["touch " + str(tmp_path / "pwned")]
    q = load_obj(tmp_path, obj)  # loads (a broken node, as in the editor) but nothing runs
    assert "torch has no operator 'os.system'" in q.nodes[n.id].error
    with pytest.raises(FileFormatError, match="torch has no operator"):
        load_program(tmp_path / "bad.json", strict=True)
    assert not (tmp_path / "pwned").exists()


def test_save_keeps_permissions_and_symlinks(tmp_path):
    path = saved(tmp_path, make_program(big=False))
    os.chmod(path, 0o640)
    link = tmp_path / "link.json"
    link.symlink_to(path.name)
    p = make_program(big=False)
    p.name = "via link"
    save_program(p, link)
    assert link.is_symlink() and load_program(path).name == "via link"
    assert (os.stat(path).st_mode & 0o777) == 0o640


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
                       st.text(max_size=12))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=20)
_dtypes = st.sampled_from(["float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_round_trip_property(tmp_path, data):
    """Random programs (chains of unary and binary ops over random-dtype parameters, random canvas
    positions and free-form sections) save and load to the same JSON, and dumps/loads agree."""
    p = Program(data.draw(st.text(min_size=1, max_size=20), "name"))
    shape = tuple(data.draw(st.lists(st.integers(0, 5), max_size=3), "shape"))
    cur = p.add_input("x", shape).id
    for k in range(data.draw(st.integers(1, 5), "length")):
        dtype = data.draw(_dtypes, "dtype")
        raw = np.random.default_rng(k).standard_normal(shape) * 100
        arr = (raw > 0) if dtype == "bool" else raw.astype(dtype)
        w = p.add_parameter(f"w{k}", arr, constant=data.draw(st.booleans(), "const"))
        n = p.add_node(data.draw(st.sampled_from(["add", "mul", "maximum"]), "binop"), [cur, w.id])
        n = p.add_node(data.draw(st.sampled_from(["relu", "abs", "neg", "sigmoid"]), "unop"), [n.outputs[0]])
        if data.draw(st.booleans(), "has pos"):
            p.set_pos(n.id, data.draw(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)), "pos"))
        cur = n.outputs[0]
    p.mark_output(cur)
    p.log = data.draw(st.lists(st.dictionaries(st.text(max_size=8), _json, max_size=3), max_size=3), "log")
    p.profile = data.draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=8), _json, max_size=3)), "profile")
    p.metadata = data.draw(st.dictionaries(st.text(max_size=8), _json, max_size=4), "metadata")
    path = tmp_path / "prop.json"
    save_program(p, path, inline_limit=data.draw(st.sampled_from([0, 4, 4096]), "inline limit"))
    assert program_to_json(load_program(path)) == program_to_json(p)
    assert program_to_json(loads(dumps(p))) == program_to_json(p)


def test_a_recorded_shape_that_disagrees_with_inference(tmp_path):
    obj = doc(tmp_path)
    i = next(k for k, v in enumerate(obj["values"]) if v["role"] == "intermediate")
    obj["values"][i]["shape"] = [4, 9]
    q = load_obj(tmp_path, obj)
    producer = obj["values"][i]["producer"]
    assert "is recorded as float32[4, 9] but add makes float32[4, 8]" in q.nodes[producer].error
    assert q.values[obj["values"][i]["id"]].shape == (4, 9)  # as saved: loading never rewrites the file's data
    with pytest.raises(FileFormatError, match=r"is recorded as float32\[4, 9\]"):
        load_program(tmp_path / "bad.json", strict=True)


def test_sidecar_arrays_are_written_exactly_as_numpy_writes_them():
    """project_file writes .npy members from a view of the array (no copy of a gigabyte weight); the
    bytes are numpy's own write_array's, header included, for every shape and dtype we save."""
    import io

    from agent_core.project_file import _write_npy
    for a in (np.random.rand(3, 5).astype(np.float32), np.arange(7, dtype=np.int64), np.asarray(np.float32(2)),
              np.zeros((0, 4), np.float32), np.ones((2, 2), bool), np.arange(6, dtype=">f4").reshape(2, 3)):
        want, got = io.BytesIO(), io.BytesIO()
        np.lib.format.write_array(want, np.asarray(a, dtype=a.dtype.newbyteorder("<")), allow_pickle=False)
        _write_npy(got, a)
        assert got.getvalue() == want.getvalue(), a.dtype


def test_a_throw_away_save_skips_the_fsyncs_and_reads_back_the_same(tmp_path, monkeypatch):
    p = make_program()
    calls = []
    monkeypatch.setattr(pf.os, "fsync", lambda fd: calls.append(fd))
    save_program(p, tmp_path / "durable.json")
    assert calls                                       # a saved project reaches the disk
    calls.clear()
    save_program(p, tmp_path / "transfer.json", durable=False)
    assert not calls
    assert (tmp_path / "transfer.json.npz").is_file()                  # the big weight in its sidecar
    assert program_to_json(load_program(tmp_path / "transfer.json")) == program_to_json(p)


def test_a_private_transfer_is_read_without_hashing_its_arrays_but_still_checked(tmp_path):
    """An isolated import's folder is read back without hashing 8.6 GB again (2_ShallowWideMLP); the
    arrays' names, dtypes, shapes and sizes are checked all the same."""
    p = make_program()
    path = saved(tmp_path, p)
    side = tmp_path / "prog.json.npz"
    vid = next(v for v, a in p.data.items() if a.size > pf.INLINE_LIMIT)
    with np.load(side, allow_pickle=False) as z:
        (key,) = z.files
    arr = p.data[vid].copy()
    arr[0, 0] += 1                                   # the bytes no longer match the recorded sha256
    np.savez(side, **{key: arr})
    with pytest.raises(FileFormatError, match="does not match the file's checksum"):
        load_program(path)
    assert (load_program(path, checksums=False).data[vid] == arr).all()
    np.savez(side, **{key: arr.astype(np.float32)})
    with pytest.raises(FileFormatError, match=r"is float32\[64, 80\], the file says float64\[64, 80\]"):
        load_program(path, checksums=False)
