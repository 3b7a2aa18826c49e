"""The program model: nodes (op, attributes, input and output values) and tensor values.

A Program is a dataflow graph whose edges are values. Node and value ids are stable ("n7", "v12"):
they survive edits, saving and loading, so the editor, the planner's regions and the decision log can
point at them. Edits go through the methods here; each one notifies subscribers (the editor observes
the model, never keeps a copy of it).
"""
from __future__ import annotations

import contextlib
import math
import operator
import zlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable

import networkx as nx
import numpy as np

from .errors import ConnectionRefused, CycleError, ProgramError, ShapeError
from .ops import DTYPE_BYTES, OpDef, TensorSpec, get_op


class Role(str, Enum):
    INPUT = "input"
    PARAMETER = "parameter"
    CONSTANT = "constant"
    INTERMEDIATE = "intermediate"
    OUTPUT = "output"


SOURCE_ROLES = (Role.INPUT, Role.PARAMETER, Role.CONSTANT)


@dataclass
class Value:
    """A tensor flowing between nodes. Program inputs, parameters and constants have no producer.

    init describes how to draw random data for an input (the reference runs on random draws):
    {"kind": "normal"} (default), {"kind": "uniform", "low": 0, "high": 1} or
    {"kind": "randint", "low": 0, "high": 10}.
    """
    id: str
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    role: Role = Role.INTERMEDIATE
    producer: str | None = None
    init: dict | None = None

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype)

    @property
    def nbytes(self) -> int:
        # computed directly: the planner asks this of thousands of values, a TensorSpec per call adds up
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass
class Node:
    id: str
    op: str
    inputs: list[str | None]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    name: str = ""
    pos: tuple[float, float] | None = None
    error: str | None = None  # the last shape-inference failure, shown as a badge in the editor

    @property
    def opdef(self) -> OpDef:
        return get_op(self.op)


@dataclass
class Diagnostic:
    severity: str  # "error" or "warning"
    code: str      # unknown-op, arity, attribute, shape, cycle, dangling-input, unused-output, ...
    message: str
    node_id: str | None = None
    value_id: str | None = None

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


Listener = Callable[[str, dict], None]


class Program:
    """A dataflow program. See the module docstring."""

    def __init__(self, name: str = "program"):
        self.name = name
        self.nodes: dict[str, Node] = {}
        self.values: dict[str, Value] = {}
        self.data: dict[str, np.ndarray] = {}   # parameter and constant data by value id
        self.inputs: list[str] = []             # program input value ids, in call order
        self.outputs: list[str] = []            # program output value ids, in return order
        self.regions: list = []                 # planner regions (agent_core.regions.Region)
        self.log: list[dict] = []               # decision log entries
        self.profile: dict | None = None        # the last profile result
        self.metadata: dict[str, Any] = {}      # source, import warnings, ...
        self._next_id = 0
        self._listeners: list[Listener] = []

    # observers ---------------------------------------------------------------------------
    def subscribe(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def unsubscribe(self, fn: Listener) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def _emit(self, event: str, **payload) -> None:
        for fn in list(self._listeners):
            fn(event, payload)

    # ids ---------------------------------------------------------------------------------
    def _new_id(self, prefix: str) -> str:
        self._next_id += 1
        return f"{prefix}{self._next_id}"

    def _claim_id(self, ident: str) -> str:
        """Reuse an id given by the caller (undo, loading) and keep the counter past it."""
        digits = ident.lstrip("nv")
        if digits.isdigit():
            self._next_id = max(self._next_id, int(digits))
        return ident

    def unique_name(self, base: str) -> str:
        taken = {v.name for v in self.values.values()} | {n.name for n in self.nodes.values()}
        if base not in taken:
            return base
        k = 1
        while f"{base}_{k}" in taken:
            k += 1
        return f"{base}_{k}"

    # lookup ------------------------------------------------------------------------------
    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise ProgramError(f"no node '{node_id}'", node_id=node_id) from None

    def value(self, value_id: str) -> Value:
        try:
            return self.values[value_id]
        except KeyError:
            raise ProgramError(f"no value '{value_id}'", value_id=value_id) from None

    def value_by_name(self, name: str) -> Value:
        for v in self.values.values():
            if v.name == name:
                return v
        raise ProgramError(f"no value named '{name}'")

    def consumers(self, value_id: str) -> list[tuple[str, int]]:
        """(node id, input port) pairs that read value_id."""
        return list(self._derived()["consumers"].get(value_id, ()))

    def consumer_map(self) -> dict[str, list[tuple[str, int]]]:
        """consumers() of every value at once, for callers that ask about many (read it, never edit)."""
        return self._derived()["consumers"]

    def memo(self, kind: str) -> dict:
        """A cache for facts derived from the current structure (codegen's region_io per node set):
        emptied whenever a node, an input or a value changes, like consumer_map()."""
        return self._derived().setdefault("memo", {}).setdefault(kind, {})

    def _structure(self) -> tuple:
        """Everything graph() and consumers() depend on: the nodes and their inputs, the values and
        their producers, in dict order. Rebuilt on every call (C-level iteration, no networkx: about a
        millisecond for 2,000 nodes), so edits made anywhere, even by assigning node.inputs directly,
        are seen; what is derived from it is cached against it."""
        nodes, values = self.nodes, self.values
        return (tuple(nodes), tuple(map(tuple, map(_INPUTS, nodes.values()))),
                tuple(values), tuple(map(_PRODUCER, values.values())))

    @contextlib.contextmanager
    def frozen(self):
        """A span in which nothing edits the nodes, their inputs or the values (the agent's kernel
        generation and region loop): the structure is read once for it instead of on every
        consumer_map(), topo_order() or codegen question (thousands of times on a model of a thousand
        nodes). Leaving the span checks that the structure is unchanged."""
        if "_frozen" in self.__dict__:        # nested: the outer span holds
            yield self
            return
        key = self.__dict__["_frozen"] = self._structure()
        failed = False
        try:
            yield self
        except BaseException:
            failed = True
            raise
        finally:
            del self.__dict__["_frozen"]
            if not failed and self._structure() != key:
                raise ProgramError("the program's nodes or values were edited inside a frozen span; "
                                   "what was derived from them there may be stale")

    def _derived(self) -> dict:
        """The consumer index and (once asked for) the topological order of the current structure:
        the planner and codegen ask for them per region, hundreds of times on a model of a thousand
        nodes, and building the networkx graph each time dominated planning and generation."""
        key = self.__dict__.get("_frozen") or self._structure()
        cache = self.__dict__.get("_derived_cache")
        if cache is None or cache["key"] != key:
            index: dict[str, list[tuple[str, int]]] = {}
            for n in self.nodes.values():
                for i, v in enumerate(n.inputs):
                    if v is not None:
                        index.setdefault(v, []).append((n.id, i))
            cache = self.__dict__["_derived_cache"] = {"key": key, "consumers": index, "order": None}
        else:
            cache["key"] = key      # an equal key: keep this one, so a frozen span compares by identity
        return cache

    def producer(self, value_id: str) -> Node | None:
        p = self.value(value_id).producer
        return self.nodes.get(p) if p else None

    def parameters(self) -> list[Value]:
        return [v for v in self.values.values() if v.role in (Role.PARAMETER, Role.CONSTANT)]

    def input_specs(self) -> list[Value]:
        return [self.values[v] for v in self.inputs]

    # building ----------------------------------------------------------------------------
    def _add_source(self, role: Role, name: str, shape, dtype: str, value_id: str | None,
                    init: dict | None = None) -> Value:
        TensorSpec(tuple(shape), dtype)  # checks the dtype
        vid = self._claim_id(value_id) if value_id else self._new_id("v")
        v = Value(vid, self.unique_name(name), tuple(int(d) for d in shape), dtype, role, None, init)
        self.values[vid] = v
        return v

    def add_input(self, name: str, shape, dtype: str = "float32", *, init: dict | None = None,
                  value_id: str | None = None) -> Value:
        v = self._add_source(Role.INPUT, name, shape, dtype, value_id, init)
        self.inputs.append(v.id)
        self._emit("value_added", value_id=v.id)
        return v

    def add_parameter(self, name: str, data: np.ndarray | None = None, *, shape=None,
                      dtype: str | None = None, constant: bool = False,
                      value_id: str | None = None, init: dict | None = None) -> Value:
        """A parameter (weights) or constant. Without data, parameters are drawn at random on use;
        with an init (see check_init) and no data, the data is drawn from it now, deterministically."""
        if data is not None:
            data = np.asarray(data)
            shape = data.shape
            dtype = dtype or _np_dtype_name(data.dtype)
        if shape is None:
            raise ProgramError(f"parameter '{name}' needs data or a shape")
        role = Role.CONSTANT if constant else Role.PARAMETER
        if init is not None:
            if constant:
                raise ProgramError(f"constant '{name}' holds the data it was given; it takes no init")
            init = check_init(init, role, name)
            if data is None:
                shape = check_shape(shape, name)
        v = self._add_source(role, name, shape, dtype or "float32", value_id, init)
        if data is None and init is not None:
            data = draw_init(init, v.shape, v.dtype, v.id)
        if data is not None:
            self.data[v.id] = data
        self._emit("value_added", value_id=v.id)
        return v

    def add_node(self, op: str, inputs: Iterable[str | None] = (), attrs: dict | None = None, *,
                 name: str | None = None, node_id: str | None = None,
                 output_ids: list[str] | None = None, pos=None, strict: bool = True) -> Node:
        """Add a node reading `inputs` (value ids; None leaves a port unconnected).

        Shapes are inferred at once. With strict=True a node that fails inference is refused
        (ShapeError); with strict=False it is added with its error recorded (the editor's way).
        """
        opdef = get_op(op)
        inputs = list(inputs)
        for vid in inputs:
            if vid is not None:
                self.value(vid)
        if strict:
            opdef.check_arity(len(inputs))
        attrs = opdef.normalize_attrs(attrs)
        nid = self._claim_id(node_id) if node_id else self._new_id("n")
        if nid in self.nodes:
            raise ProgramError(f"node id '{nid}' is taken", node_id=nid)
        node = Node(nid, opdef.name, inputs, [], attrs, name or self.unique_name(opdef.name), pos)
        specs = self._infer(node)
        if node.error and strict:
            raise ShapeError(node.error, node_id=nid)
        n_out = len(specs) if specs else len(opdef.outputs)
        for k in range(n_out):
            vid = self._claim_id(output_ids[k]) if output_ids and k < len(output_ids) else self._new_id("v")
            spec = specs[k] if specs else TensorSpec((), "float32")
            suffix = "" if n_out == 1 else f".{opdef.outputs[k] if k < len(opdef.outputs) else k}"
            self.values[vid] = Value(vid, self.unique_name(node.name + suffix), spec.shape, spec.dtype,
                                     Role.INTERMEDIATE, nid)
            node.outputs.append(vid)
        self.nodes[nid] = node
        self._emit("node_added", node_id=nid)
        return node

    def mark_output(self, value_id: str, is_output: bool = True) -> None:
        v = self.value(value_id)
        if is_output and value_id not in self.outputs:
            if v.role in SOURCE_ROLES and v.role != Role.INPUT:
                raise ProgramError(f"'{v.name}' is a {v.role.value}; only computed values can be outputs")
            self.outputs.append(value_id)
            if v.producer:
                v.role = Role.OUTPUT
        elif not is_output and value_id in self.outputs:
            self.outputs.remove(value_id)
            if v.role == Role.OUTPUT:
                v.role = Role.INTERMEDIATE
        self._emit("value_changed", value_id=value_id)

    # editing -----------------------------------------------------------------------------
    def remove_node(self, node_id: str) -> dict:
        """Remove a node and its output values; consumers' ports become unconnected.

        Returns a record that `restore_node` takes to undo exactly this removal.
        """
        node = self.node(node_id)
        record = {
            "node": node, "values": [self.values[v] for v in node.outputs],
            "consumers": {v: self.consumers(v) for v in node.outputs},
            "outputs": [(self.outputs.index(v), v) for v in node.outputs if v in self.outputs],
            # a region that loses a member is no longer what was planned or verified: drop it
            "regions": [(i, r) for i, r in enumerate(self.regions) if node_id in _region_nodes(r)],
        }
        for _, r in reversed(record["regions"]):
            self.regions.remove(r)
        for vid, uses in record["consumers"].items():
            for cid, port in uses:
                self.nodes[cid].inputs[port] = None
        for _, vid in sorted(record["outputs"], reverse=True):
            self.outputs.remove(vid)
        for vid in node.outputs:
            self.data.pop(vid, None)
            del self.values[vid]
        del self.nodes[node_id]
        self._emit("node_removed", node_id=node_id)
        if record["regions"]:
            self._emit("regions_changed", region_ids=[_region_id(r) for _, r in record["regions"]],
                       action="drop")
        for cid in {c for uses in record["consumers"].values() for c, _ in uses}:
            self.reinfer(cid)
        return record

    def restore_node(self, record: dict) -> None:
        node: Node = record["node"]
        self.nodes[node.id] = node
        for v in record["values"]:
            self.values[v.id] = v
        for idx, vid in sorted(record["outputs"]):
            self.outputs.insert(idx, vid)
        for vid, uses in record["consumers"].items():
            for cid, port in uses:
                self.nodes[cid].inputs[port] = vid
        self._emit("node_added", node_id=node.id)
        for cid in {c for uses in record["consumers"].values() for c, _ in uses}:
            self.reinfer(cid)
        for idx, r in record.get("regions", []):
            self.regions.insert(idx, r)
        if record.get("regions"):
            self._emit("regions_changed", region_ids=[_region_id(r) for _, r in record["regions"]],
                       action="restore")

    def remove_value(self, value_id: str) -> None:
        """Remove a program input, parameter or constant; its consumers become unconnected."""
        v = self.value(value_id)
        if v.producer:
            raise ProgramError(f"'{v.name}' is produced by a node; remove the node instead")
        uses = self.consumers(value_id)
        for cid, port in uses:
            self.nodes[cid].inputs[port] = None
        if value_id in self.inputs:
            self.inputs.remove(value_id)
        if value_id in self.outputs:
            self.outputs.remove(value_id)
        self.data.pop(value_id, None)
        del self.values[value_id]
        self._emit("value_removed", value_id=value_id)
        for cid, _ in uses:
            self.reinfer(cid)

    def can_connect(self, value_id: str, node_id: str, port: int) -> str | None:
        """Why connecting value_id to node_id's input `port` is refused, or None if it is allowed."""
        node, v = self.node(node_id), self.value(value_id)
        opdef = node.opdef
        lo, hi = opdef.arity()
        if port < 0 or (hi is not None and port >= hi):
            return f"{node.name} ({node.op}) has no input port {port}"
        if v.producer == node_id:
            return f"{node.name} cannot read its own output '{v.name}' (that would be a cycle)"
        if v.producer and node_id in nx.ancestors(self.graph(), v.producer):
            return (f"connecting '{v.name}' into {node.name} would create a cycle: "
                    f"{node.name} already feeds {self.nodes[v.producer].name}")
        trial = list(node.inputs) + [None] * max(0, max(port + 1, lo) - len(node.inputs))
        trial[port] = value_id
        probe = Node(node.id, node.op, trial, node.outputs, node.attrs, node.name)
        if all(t is not None for t in trial[:lo]):
            self._infer(probe)
            if probe.error:
                return probe.error
        return None

    def connect(self, value_id: str, node_id: str, port: int) -> None:
        reason = self.can_connect(value_id, node_id, port)
        if reason:
            raise (CycleError if "cycle" in reason else ConnectionRefused)(reason, node_id=node_id)
        self.set_input(node_id, port, value_id)

    def set_input(self, node_id: str, port: int, value_id: str | None) -> None:
        """Low-level rewiring (no legality check beyond existence); use connect() for user edits."""
        node = self.node(node_id)
        if value_id is not None:
            self.value(value_id)
        while len(node.inputs) <= port:
            node.inputs.append(None)
        node.inputs[port] = value_id
        if value_id is None:   # trailing open optional ports are no ports: undo of a bias leaves none
            while node.inputs and node.inputs[-1] is None and len(node.inputs) > node.opdef.arity()[0]:
                node.inputs.pop()
        self._emit("edge_changed", node_id=node_id, port=port)
        self.reinfer(node_id)

    def set_attrs(self, node_id: str, attrs: dict) -> dict:
        """Change attributes (validated); returns the previous attributes for undo."""
        node = self.node(node_id)
        new = node.opdef.normalize_attrs({**node.attrs, **attrs})
        old = dict(node.attrs)
        node.attrs = new
        self._emit("node_changed", node_id=node_id)
        self.reinfer(node_id)
        return old

    def set_pos(self, node_id: str, pos: tuple[float, float] | None) -> None:
        self.node(node_id).pos = None if pos is None else (float(pos[0]), float(pos[1]))
        self._emit("node_moved", node_id=node_id)

    def rename(self, ident: str, name: str) -> None:
        if not name or not name.strip():
            raise ProgramError("a name cannot be empty")
        obj = self.nodes.get(ident) or self.value(ident)
        if obj.name != name:
            obj.name = self.unique_name(name)
        self._emit("node_changed" if ident in self.nodes else "value_changed",
                   **({"node_id": ident} if ident in self.nodes else {"value_id": ident}))

    def source_state(self, value_id: str) -> dict:
        """What set_source can change on a program input, parameter or constant (for undo)."""
        v = self.value(value_id)
        data = self.data.get(value_id)
        return {"shape": v.shape, "dtype": v.dtype, "init": dict(v.init) if v.init else None,
                "data": None if data is None else np.array(data, copy=True)}

    def set_source(self, value_id: str, *, shape=None, dtype: str | None = None, init: dict | None = None,
                   data=None) -> dict:
        """Edit a program input, parameter or constant; every argument is checked before anything
        changes. A parameter whose shape, dtype or init changes is drawn again from its init (a
        fixed seed per value id: redoing gives the same numbers). A constant takes new data (its
        shape follows it) or a dtype its data is cast to. Returns the previous state for
        restore_source; readers are re-inferred."""
        v = self.value(value_id)
        if v.producer:
            raise ProgramError(f"'{v.name}' is computed by {self.nodes[v.producer].name}; "
                               "only inputs, parameters and constants are edited here", value_id=value_id)
        old = self.source_state(value_id)
        new_shape = v.shape if shape is None else check_shape(shape, v.name)
        new_dtype = v.dtype if dtype is None else dtype
        TensorSpec(new_shape, new_dtype)  # checks the dtype
        if v.role != Role.INPUT and new_dtype != v.dtype and new_dtype not in _DATA_DTYPES:
            raise ProgramError(f"'{v.name}' holds data, which can be {', '.join(_DATA_DTYPES)}; not {new_dtype}",
                               value_id=value_id)
        new_init = v.init if init is None else check_init(init, v.role, v.name)
        new_data = self.data.get(value_id)
        if data is not None:
            if v.role == Role.INPUT:
                raise ProgramError(f"program input '{v.name}' takes no data: it is drawn when the program runs",
                                   value_id=value_id)
            new_data = _typed_data(data, dtype or v.dtype, v.name)
            if shape is not None and new_data.shape != new_shape:
                raise ShapeError(f"'{v.name}': the data has shape {list(new_data.shape)}, not {list(new_shape)}",
                                 value_id=value_id)
            new_shape, new_dtype, new_init = new_data.shape, _np_dtype_name(new_data.dtype), None
        elif v.role == Role.CONSTANT:
            if new_shape != v.shape:
                raise ShapeError(f"constant '{v.name}' takes its shape from its value: type a "
                                 f"{len(new_shape)}-d value instead", value_id=value_id)
            if new_data is not None and new_dtype != v.dtype:
                new_data = new_data.astype(new_dtype)
        elif v.role == Role.PARAMETER and (new_shape, new_dtype, new_init) != (v.shape, v.dtype, v.init):
            new_init = new_init or dict(DEFAULT_PARAMETER_INIT)
            new_data = draw_init(new_init, new_shape, new_dtype, value_id)
        self._put_source(v, new_shape, new_dtype, new_init, new_data)
        return old

    def restore_source(self, value_id: str, state: dict) -> None:
        """Put back exactly what source_state recorded (undo of set_source)."""
        v = self.value(value_id)
        data = state["data"]
        self._put_source(v, tuple(state["shape"]), state["dtype"], state["init"],
                         None if data is None else np.array(data, copy=True))

    def _put_source(self, v: Value, shape, dtype: str, init, data) -> None:
        v.shape, v.dtype, v.init = tuple(shape), dtype, (dict(init) if init else None)
        if data is None:
            self.data.pop(v.id, None)
        else:
            self.data[v.id] = data
        self._emit("value_changed", value_id=v.id)
        for cid in dict.fromkeys(c for c, _ in self.consumers(v.id)):
            self.reinfer(cid)

    # inference ---------------------------------------------------------------------------
    def _infer(self, node: Node) -> list[TensorSpec] | None:
        """Infer node's output specs; on failure set node.error and return None."""
        try:
            opdef = node.opdef
        except ProgramError as e:
            node.error = str(e)
            return None
        try:
            lo, hi = opdef.arity()
            if hi is not None and _arity_count(node.inputs) > hi:
                opdef.check_arity(_arity_count(node.inputs))
            specs = []
            for i, vid in enumerate(node.inputs):
                if vid is None:
                    specs.append(None)
                    continue
                specs.append(self.value(vid).spec)
            missing = [opdef.port_name(i) for i in range(lo) if i >= len(specs) or specs[i] is None]
            if missing:
                raise ProgramError(f"input {', '.join(missing)} is not connected")
            out = opdef.infer(specs, node.attrs)
            node.error = None
            return list(out)
        except ProgramError as e:
            node.error = f"{node.name} ({node.op}): {e}" if not str(e).startswith(node.name) else str(e)
        except (ValueError, TypeError, IndexError, RuntimeError) as e:
            node.error = f"{node.name} ({node.op}): {e}"
        return None

    def reinfer(self, node_id: str) -> None:
        """Re-run inference on node_id and everything downstream of it (after an edit)."""
        if node_id not in self.nodes:
            return
        g = self.graph()
        # order only what the edit reaches, not the whole program
        downstream = g.subgraph({node_id} | nx.descendants(g, node_id))
        try:
            order = list(nx.lexicographical_topological_sort(downstream, key=_id_key))
        except nx.NetworkXUnfeasible:  # the edit made a cycle: validate() reports it
            order = [node_id]
        for nid in order:
            node = self.nodes[nid]
            before = node.error
            specs = self._infer(node)
            if specs:
                self._resize_outputs(node, len(specs))
                for vid, spec in zip(node.outputs, specs):
                    v = self.values[vid]
                    v.shape, v.dtype = spec.shape, spec.dtype
            if specs or before != node.error:
                self._emit("node_changed", node_id=nid)

    def _resize_outputs(self, node: Node, count: int) -> None:
        """Give a multi-output node (split, chunk) `count` outputs after an attribute edit.

        Extra outputs are dropped and their readers become unconnected; new ones are appended."""
        while len(node.outputs) > count:
            vid = node.outputs.pop()
            for cid, port in self.consumers(vid):
                self.nodes[cid].inputs[port] = None
            if vid in self.outputs:
                self.outputs.remove(vid)
            del self.values[vid]
        while len(node.outputs) < count:
            vid = self._new_id("v")
            self.values[vid] = Value(vid, self.unique_name(f"{node.name}.{len(node.outputs)}"), (),
                                     "float32", Role.INTERMEDIATE, node.id)
            node.outputs.append(vid)

    def infer_all(self) -> dict[str, str]:
        """Re-infer every node in order; returns {node id: error} for those that fail."""
        errors = {}
        for nid in self._safe_order(self.graph()):
            node = self.nodes[nid]
            specs = self._infer(node)
            if specs:
                for vid, spec in zip(node.outputs, specs):
                    v = self.values[vid]
                    v.shape, v.dtype = spec.shape, spec.dtype
            else:
                errors[nid] = node.error
        return errors

    # graph views -------------------------------------------------------------------------
    def graph(self) -> nx.DiGraph:
        """Node-level dependency graph: an edge producer -> consumer per value read (attr value)."""
        g = nx.DiGraph()
        g.add_nodes_from(self.nodes)
        for n in self.nodes.values():
            for vid in n.inputs:
                if vid is None or vid not in self.values:
                    continue
                p = self.values[vid].producer
                if p is not None and p in self.nodes:
                    g.add_edge(p, n.id, value=vid)
        return g

    @staticmethod
    def _has_cycle(g: nx.DiGraph) -> bool:
        return not nx.is_directed_acyclic_graph(g)

    def _safe_order(self, g: nx.DiGraph) -> list[str]:
        try:
            return list(nx.lexicographical_topological_sort(g, key=_id_key))
        except nx.NetworkXUnfeasible:
            return sorted(g.nodes, key=_id_key)

    def topo_order(self) -> list[str]:
        """Node ids in a deterministic topological order; CycleError names the cycle."""
        derived = self._derived()
        if derived["order"] is not None:
            return list(derived["order"])
        g = self.graph()
        try:
            derived["order"] = list(nx.lexicographical_topological_sort(g, key=_id_key))
            return list(derived["order"])
        except nx.NetworkXUnfeasible:
            cyc = nx.find_cycle(g)
            names = " -> ".join(self.nodes[a].name for a, _ in cyc) + f" -> {self.nodes[cyc[0][0]].name}"
            raise CycleError(f"the program has a cycle: {names}", node_id=cyc[0][0]) from None

    # validation --------------------------------------------------------------------------
    def validate(self) -> list[Diagnostic]:
        """All problems, errors first: unknown ops, arity, attributes, shapes, cycles, dangling
        inputs, unknown values, unused outputs and values (warnings)."""
        diags: list[Diagnostic] = []
        g = self.graph()
        if self._has_cycle(g):
            try:
                self.topo_order()
            except CycleError as e:
                diags.append(Diagnostic("error", "cycle", str(e), node_id=e.node_id))
        for nid in self._safe_order(g):
            n = self.nodes[nid]
            try:
                opdef = n.opdef
            except ProgramError as e:
                diags.append(Diagnostic("error", "unknown-op", f"{n.name}: {e}", node_id=nid))
                continue
            for i, vid in enumerate(n.inputs):
                if vid is not None and vid not in self.values:
                    diags.append(Diagnostic("error", "dangling-input",
                                            f"{n.name}: input {opdef.port_name(i)} reads unknown value '{vid}'",
                                            node_id=nid))
            if any(vid is not None and vid not in self.values for vid in n.inputs):
                continue
            lo, hi = opdef.arity()
            count = _arity_count(n.inputs)
            if hi is not None and count > hi:
                try:
                    opdef.check_arity(count)
                except ProgramError as e:
                    diags.append(Diagnostic("error", "arity", f"{n.name}: {e}", node_id=nid))
                continue
            padded = list(n.inputs) + [None] * max(0, lo - len(n.inputs))
            dangling = [opdef.port_name(i) for i, v in enumerate(padded) if v is None and i < lo]
            if dangling:
                diags.append(Diagnostic("error", "dangling-input",
                                        f"{n.name} ({n.op}): input {', '.join(dangling)} is not connected",
                                        node_id=nid))
                continue
            try:
                opdef.normalize_attrs(n.attrs)
            except ProgramError as e:
                diags.append(Diagnostic("error", "attribute", f"{n.name}: {e}", node_id=nid))
                continue
            specs = self._infer(n)
            if specs is None:
                diags.append(Diagnostic("error", "shape", n.error or f"{n.name}: inference failed",
                                        node_id=nid))
            elif len(specs) != len(n.outputs):
                diags.append(Diagnostic("error", "shape",
                                        f"{n.name}: {n.op} makes {len(specs)} outputs but the node has "
                                        f"{len(n.outputs)}", node_id=nid))
            else:
                for vid, spec in zip(n.outputs, specs):
                    v = self.values.get(vid)
                    if v is None:
                        diags.append(Diagnostic("error", "dangling-output",
                                                f"{n.name}: output value '{vid}' does not exist", node_id=nid))
                    elif (v.shape, v.dtype) != (spec.shape, spec.dtype):
                        diags.append(Diagnostic("error", "shape",
                                                f"{n.name}: output '{v.name}' is recorded as {v.spec} but "
                                                f"{n.op} makes {spec}", node_id=nid, value_id=vid))
        for vid in self.outputs:
            if vid not in self.values:
                diags.append(Diagnostic("error", "dangling-output", f"program output '{vid}' does not exist"))
        if not self.outputs and self.nodes:
            diags.append(Diagnostic("error", "no-output", "the program has no output"))
        used = {v for n in self.nodes.values() for v in n.inputs if v} | set(self.outputs)
        for v in self.values.values():
            if v.id in used:
                continue
            if v.producer:
                diags.append(Diagnostic("warning", "unused-output",
                                        f"output '{v.name}' of {self.nodes[v.producer].name} is never used",
                                        node_id=v.producer, value_id=v.id))
            else:
                diags.append(Diagnostic("warning", "unused-value",
                                        f"{v.role.value} '{v.name}' is never used", value_id=v.id))
        diags.sort(key=lambda d: d.severity != "error")
        return diags

    def check(self) -> None:
        """Raise the first validation error (ProgramError or CycleError), if any."""
        for d in self.validate():
            if d.severity == "error":
                cls = CycleError if d.code == "cycle" else (ShapeError if d.code == "shape" else ProgramError)
                raise cls(d.message, node_id=d.node_id, value_id=d.value_id)

    # summaries ---------------------------------------------------------------------------
    def node_specs(self, node_id: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
        n = self.node(node_id)
        ins = [self.values[v].spec for v in n.inputs if v is not None]
        outs = [self.values[v].spec for v in n.outputs]
        return ins, outs

    def node_flops(self, node_id: str) -> int:
        n = self.node(node_id)
        ins, outs = self.node_specs(node_id)
        return n.opdef.count_flops(ins, outs, n.attrs)

    def node_bytes(self, node_id: str) -> int:
        """Bytes read and written by the node run alone (each input read once)."""
        ins, outs = self.node_specs(node_id)
        return sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)

    def __repr__(self) -> str:
        return f"Program({self.name!r}, {len(self.nodes)} nodes, {len(self.values)} values)"


MAX_RANK = 8
MAX_DRAWN = 1 << 27   # elements a parameter may have to be drawn in memory (512 MiB of float32)

# what a parameter can be drawn from (the studio's "init"), and the numbers each kind takes
PARAMETER_INITS = {"normal": ("mean", "std"), "uniform": ("low", "high"), "zeros": (), "ones": ()}
# what an input can be drawn from (agent_core.reference.draw)
INPUT_INITS = {"normal": (), "uniform": ("low", "high"), "randint": ("low", "high"), "positive": (),
               "softmax": ()}
INIT_DEFAULTS = {"mean": 0.0, "std": 0.1, "low": 0.0, "high": 1.0}
DEFAULT_PARAMETER_INIT = {"kind": "normal", "mean": 0.0, "std": 0.1}


def check_shape(shape, name: str = "value") -> tuple[int, ...]:
    """A shape as a tuple of positive ints (at most MAX_RANK of them); ShapeError says what is wrong."""
    try:
        dims = list(shape)
    except TypeError:
        raise ShapeError(f"'{name}': a shape is a list of sizes such as [8, 16], got {shape!r}") from None
    if len(dims) > MAX_RANK:
        raise ShapeError(f"'{name}': {len(dims)} dimensions is more than the {MAX_RANK} supported")
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ShapeError(f"'{name}': every size must be a whole number of at least 1, got {d!r}")
        out.append(int(d))
    return tuple(out)


def check_init(init, role: Role, name: str = "value") -> dict:
    """An init as a complete dict ({"kind": ..., and its numbers}); ProgramError names what is wrong."""
    kinds = PARAMETER_INITS if role == Role.PARAMETER else INPUT_INITS if role == Role.INPUT else None
    if kinds is None:
        raise ProgramError(f"'{name}' is a {role.value}; only inputs and parameters take an init")
    if not isinstance(init, dict) or init.get("kind") not in kinds:
        raise ProgramError(f"'{name}': init kind must be one of {', '.join(kinds)}, got "
                           f"{init.get('kind') if isinstance(init, dict) else init!r}")
    extra = set(init) - {"kind", *kinds[init["kind"]]}
    if extra:
        raise ProgramError(f"'{name}': init {init['kind']} takes {', '.join(kinds[init['kind']]) or 'no numbers'}, "
                           f"not {', '.join(sorted(extra))}")
    out = {"kind": init["kind"]}
    for key in kinds[init["kind"]]:
        x = init.get(key, INIT_DEFAULTS[key])
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) or not math.isfinite(x):
            raise ProgramError(f"'{name}': init {key} must be a finite number, got {x!r}")
        out[key] = float(x)
    if "std" in out and out["std"] < 0:
        raise ProgramError(f"'{name}': init std must not be negative, got {out['std']:g}")
    if "low" in out and out["low"] >= out["high"]:
        raise ProgramError(f"'{name}': init low ({out['low']:g}) must be below high ({out['high']:g})")
    return out


def draw_init(init: dict, shape, dtype: str, value_id: str) -> np.ndarray:
    """A parameter's data drawn from its init, seeded by its value id (the same numbers every time)."""
    n = math.prod(shape)
    if n > MAX_DRAWN:
        raise ShapeError(f"a parameter of {n:,} elements is too large to draw here (at most {MAX_DRAWN:,})",
                         value_id=value_id)
    kind = init["kind"]
    if kind in ("zeros", "ones"):
        return (np.zeros if kind == "zeros" else np.ones)(shape, dtype=dtype)
    rng = np.random.default_rng(zlib.crc32(value_id.encode()))
    if kind == "uniform":
        x = rng.uniform(init["low"], init["high"], size=shape)
    else:
        x = rng.normal(init["mean"], init["std"], size=shape)
    return np.asarray(x).astype(dtype)


def _typed_data(data, dtype: str | None, name: str) -> np.ndarray:
    """Numbers a user typed (a scalar or nested lists) as an array of a supported dtype."""
    try:
        arr = np.asarray(data)
    except ValueError:
        raise ShapeError(f"'{name}': the rows of the value have different lengths") from None
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise ProgramError(f"'{name}': a value is a number or nested lists of numbers")
    if dtype is None:
        dtype = "bool" if arr.dtype.kind == "b" else ("int64" if arr.dtype.kind in "iu" else "float32")
    TensorSpec(arr.shape, dtype)
    if np.dtype(dtype).kind in "biu" and arr.dtype.kind == "f" and not np.array_equal(arr, np.round(arr)):
        raise ProgramError(f"'{name}' is {dtype}: the value holds fractions (choose a float dtype first)")
    arr = arr.astype(dtype)
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ProgramError(f"'{name}': the value holds inf or nan")
    return arr


def _region_nodes(region) -> list[str]:
    return region.nodes if hasattr(region, "nodes") else region.get("nodes", [])


def _region_id(region) -> str:
    return region.id if hasattr(region, "id") else region.get("id", "")


def _arity_count(inputs: list) -> int:
    """Inputs that count towards arity: everything up to the last connected port."""
    n = len(inputs)
    while n and inputs[n - 1] is None:
        n -= 1
    return n


_INPUTS, _PRODUCER = operator.attrgetter("inputs"), operator.attrgetter("producer")


def _id_key(ident: str) -> str:
    digits = ident.lstrip("nv")
    return f"{int(digits):012d}" if digits.isdigit() else ident


_DATA_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")  # numpy holds these


def _np_dtype_name(dt) -> str:
    name = np.dtype(dt).name
    if name not in _DATA_DTYPES:
        raise ProgramError(f"unsupported parameter dtype {name}")
    return name
