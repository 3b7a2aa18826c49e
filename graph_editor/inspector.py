"""The inspector: what is selected, in full. For a node: op, name, editable attributes (validated by
the op's Attr before any command is pushed), input and output shapes and dtypes, bytes and FLOPs,
parameters with their shape, dtype and init (editable), and for each unconnected port "New input",
"New parameter" and a choice of existing values to connect. For a program input, parameter or
constant: its name, shape, dtype, init or typed value (all editable) and readers. For nothing: the
program's summary and its diagnostics. Every edit is checked by the model before one undo command
is pushed; a refused one shows its reason under the field and changes nothing."""
from __future__ import annotations

import json

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QFrame, QGridLayout, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QScrollArea, QVBoxLayout, QWidget)

from agent_core.errors import ProgramError, ShapeError, StitchError
from agent_core.ir import PARAMETER_INITS, Program, Role
from agent_core.ops import DTYPES, Attr
from agent_core.text import plural

from . import commands as C
from .node_item import fmt_attr, fmt_spec
from .port_shapes import expected_shape

MAX_TYPED = 4096          # numbers a constant typed in the inspector may hold
MAX_CONNECT_CHOICES = 300  # values listed under "connect a value…" (the nearest in program order)


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_count(n: int) -> str:
    for unit, k in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return str(n)


def parse_attr(attr: Attr, text: str):
    """Text from an editor -> a value for Attr.check (which gives the error message if it is wrong)."""
    t = text.strip()
    if t == "" or t.lower() == "none":
        return None if attr.optional else t
    try:
        if attr.kind == "int":
            return int(t)
        if attr.kind == "float":
            return float(t)
        if attr.kind == "scalar":
            return int(t) if t.lstrip("-").isdigit() else float(t)
        if attr.kind == "ints_or_str" and (t in (attr.choices or ()) or not t.strip("[]() -").replace(",", "").replace(" ", "").isdigit()):
            return t  # a named mode such as conv padding "same"; Attr.check refuses anything else
        if attr.kind in ("ints", "floats", "ints_or_str"):
            parts = [p for p in t.strip("[]() ").replace(",", " ").split() if p]
            conv = float if attr.kind == "floats" else int
            return [conv(p) for p in parts]
        if attr.kind == "json":
            return json.loads(t)
    except ValueError:
        return t  # Attr.check words the refusal ("must be an integer, got '1.5x'")
    return t


def parse_shape(text: str) -> tuple[int, ...]:
    """'8, 16', '8 16', '[8,16]' or '(8, 16)' -> (8, 16); '[]' is a scalar. ShapeError says what is wrong."""
    t = text.strip()
    if not t:
        raise ShapeError("type a shape such as 8, 16 ([] for a scalar)")
    parts = [p for p in t.strip("[]() ").replace(",", " ").split() if p]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ShapeError(f"'{t}' is not a shape: sizes are whole numbers, such as 8, 16") from None


def parse_value(text: str):
    """What a user types for a constant: a number or nested lists of numbers ('0.5', '[1, 2]')."""
    t = text.strip().replace("(", "[").replace(")", "]")
    try:
        value = json.loads(t)
    except ValueError:
        raise ProgramError(f"'{text.strip()}' is not a value: type a number such as 0.5 or a list such as "
                           "[1, 2, 3]") from None
    if np.size(np.asarray(value, dtype=object)) > MAX_TYPED:
        raise ProgramError(f"a constant typed here holds at most {MAX_TYPED:,} numbers; use a parameter "
                           "for larger tensors")
    return value


def _shape_text(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


class Inspector(QScrollArea):
    rename_requested = Signal(str, str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.program: Program | None = None
        self.stack = None
        self.target: tuple[str, str] | None = None   # ("node", id) / ("value", id) / None
        self.attr_editors: dict[str, QWidget] = {}
        self.attr_errors: dict[str, QLabel] = {}
        # the editors of inputs, parameters and constants, by (value id, "shape" / "dtype" / "init" /
        # "mean" / "std" / "low" / "high" / "value" / "name"), and one error line per value
        self.source_editors: dict[tuple[str, str], QWidget] = {}
        self.source_errors: dict[str, QLabel] = {}
        # what an unconnected input port offers, by (port, "input" / "parameter" / "connect")
        self.port_actions: dict[tuple[int, str], QWidget] = {}
        self.port_error: QLabel | None = None
        self._timer = QTimer(self, singleShot=True, interval=0, timeout=self.rebuild)
        self.rebuild()

    def set_document(self, program: Program, stack) -> None:
        self.program, self.stack = program, stack
        self.target = None
        self.rebuild()

    def show_node(self, node_id: str | None) -> None:
        self.target = ("node", node_id) if node_id else None
        self.rebuild()

    def show_value(self, value_id: str) -> None:
        self.target = ("value", value_id)
        self.rebuild()

    def model_changed(self) -> None:
        """Any model event: redraw on the next loop turn (one rebuild for a burst of events)."""
        if not self._timer.isActive():
            self._timer.start()

    # building -------------------------------------------------------------------------------
    def rebuild(self) -> None:
        self.attr_editors, self.attr_errors = {}, {}
        self.source_editors, self.source_errors, self.port_actions, self.port_error = {}, {}, {}, None
        w = QWidget()
        w.setObjectName("InspectorBody")
        self._lay = QVBoxLayout(w)
        self._lay.setContentsMargins(10, 8, 10, 8)
        self._lay.setSpacing(6)
        p = self.program
        if p is None:
            self._lay.addWidget(QLabel("No program"))
        elif self.target and self.target[0] == "node" and self.target[1] in p.nodes:
            self._node(self.target[1])
        elif self.target and self.target[0] == "value" and self.target[1] in p.values:
            self._value(self.target[1])
        else:
            self._summary()
        self._lay.addStretch(1)
        self.setWidget(w)

    def _title(self, text: str, sub: str = "") -> None:
        t = QLabel(text)
        t.setObjectName("InspectorTitle")
        self._lay.addWidget(t)
        if sub:
            s = QLabel(sub)
            s.setObjectName("Muted")
            s.setWordWrap(True)
            self._lay.addWidget(s)

    def _section(self, text: str) -> None:
        s = QLabel(text.upper())
        s.setObjectName("InspectorSection")
        self._lay.addWidget(s)

    def _grid(self, rows: list[list[str]], header: list[str] | None = None) -> QGridLayout:
        g = QGridLayout()
        g.setHorizontalSpacing(10)
        g.setVerticalSpacing(2)
        r0 = 0
        if header:
            for c, h in enumerate(header):
                lab = QLabel(h)
                lab.setObjectName("Muted")
                g.addWidget(lab, 0, c)
            r0 = 1
        for r, row in enumerate(rows):
            for c, cell in enumerate(row):
                lab = QLabel(cell)
                lab.setTextInteractionFlags(Qt.TextSelectableByMouse)
                g.addWidget(lab, r0 + r, c)
        self._lay.addLayout(g)
        return g

    def _summary(self) -> None:
        p = self.program
        self._title(p.name, f"{plural(len(p.nodes), 'node')} · {plural(len(p.values), 'value')}")
        params = p.parameters()
        pbytes = sum(v.nbytes for v in params)
        self._grid([["inputs", str(len(p.inputs))], ["outputs", str(len(p.outputs))],
                    ["parameters", f"{len(params)} ({human_bytes(pbytes)})"]])
        if p.inputs:
            self._section("Inputs")
            self._grid([[p.values[v].name, fmt_spec(p.values[v].shape, p.values[v].dtype)] for v in p.inputs])
        if p.outputs:
            self._section("Outputs")
            self._grid([[p.values[v].name, fmt_spec(p.values[v].shape, p.values[v].dtype)]
                        for v in p.outputs if v in p.values])
        if len(p.nodes) <= 1000:  # validation runs after every edit here; large programs use F7
            diags = p.validate()
            if diags:
                self._section(f"Diagnostics ({len(diags)})")
                for d in diags[:30]:
                    lab = QLabel(str(d))
                    lab.setWordWrap(True)
                    lab.setObjectName("Error" if d.severity == "error" else "Warning")
                    self._lay.addWidget(lab)
        hint = QLabel("Select a node to inspect it. Tab or double-click on the canvas adds a node.")
        hint.setObjectName("Muted")
        hint.setWordWrap(True)
        self._lay.addWidget(hint)

    def _node(self, nid: str) -> None:
        p = self.program
        node = p.nodes[nid]
        try:
            opdef = node.opdef
        except StitchError:
            opdef = None
        self._title(node.op, f"{opdef.category} · {opdef.doc}" if opdef and opdef.doc
                    else (opdef.category if opdef else "unknown op"))
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignRight)
        name = QLineEdit(node.name)
        name.setObjectName("NameEdit")
        name.editingFinished.connect(lambda: self._rename(nid, name.text()))
        form.addRow("name", name)
        self._lay.addLayout(form)
        if node.error:
            err = QLabel(node.error)
            err.setObjectName("Error")
            err.setWordWrap(True)
            self._lay.addWidget(err)
        if opdef and opdef.attrs:
            self._section("Attributes")
            af = QFormLayout()
            af.setLabelAlignment(Qt.AlignRight)
            for a in opdef.attrs:
                editor = self._attr_editor(nid, a, node.attrs.get(a.name))
                box = QVBoxLayout()
                box.setSpacing(1)
                box.addWidget(editor)
                msg = QLabel("")
                msg.setObjectName("Error")
                msg.setWordWrap(True)
                msg.hide()
                box.addWidget(msg)
                self.attr_editors[a.name], self.attr_errors[a.name] = editor, msg
                lab = QLabel(a.name)
                if a.doc:
                    lab.setToolTip(a.doc)
                    editor.setToolTip(a.doc)
                af.addRow(lab, box)
            self._lay.addLayout(af)
        self._section("Inputs")
        rows, free = [], []
        for i in range(max(len(node.inputs), len(opdef.inputs) if opdef else 0)):
            vid = node.inputs[i] if i < len(node.inputs) else None
            port = opdef.port_name(i) if opdef else f"in{i}"
            v = p.values.get(vid) if vid else None
            if v is None:
                rows.append([port, "—", "unconnected", ""])
                free.append((i, port))
            else:
                rows.append([port, v.name, fmt_spec(v.shape, v.dtype), v.role.value])
        self._grid(rows, ["port", "value", "spec", "role"])
        if opdef is not None:
            for i, port in free:
                self._free_port(nid, i, port)
            if free:
                self.port_error = QLabel("")
                self.port_error.setObjectName("Error")
                self.port_error.setWordWrap(True)
                self.port_error.hide()
                self._lay.addWidget(self.port_error)
        self._section("Outputs")
        og = QGridLayout()
        og.setHorizontalSpacing(10)
        for r, vid in enumerate(node.outputs):
            v = p.values[vid]
            og.addWidget(QLabel(v.name), r, 0)
            og.addWidget(QLabel(fmt_spec(v.shape, v.dtype)), r, 1)
            cb = QCheckBox("program output")
            cb.setChecked(vid in p.outputs)
            cb.toggled.connect(lambda on, vid=vid: self._push(C.MarkOutput(p, vid, on)))
            og.addWidget(cb, r, 2)
        self._lay.addLayout(og)
        if not node.error:
            self._section("Cost")
            try:
                flops, nbytes = p.node_flops(nid), p.node_bytes(nid)
                self._grid([["FLOPs", human_count(flops)], ["bytes moved", human_bytes(nbytes)],
                            ["intensity", f"{flops / nbytes:.2f} FLOP/B" if nbytes else "—"]])
            except Exception as e:  # a cost rule that fails must not hide the rest of the inspector
                self._lay.addWidget(QLabel(f"cost unavailable: {e}"))
        params = [p.values[v] for v in node.inputs if v and p.values[v].role in (Role.PARAMETER, Role.CONSTANT)]
        if params:
            self._section("Parameters")
            for v in params:
                self._param(v)

    def _free_port(self, nid: str, port: int, name: str) -> None:
        """What an unconnected port offers: a new input or parameter for it, or an existing value."""
        p = self.program
        shape = expected_shape(p, nid, port)
        declared = self.program.nodes[nid].opdef.inputs
        optional = port < len(declared) and declared[port].endswith("?")
        lab = QLabel(f"{name.rstrip('?')}{' (optional)' if optional else ''}: unconnected")
        lab.setObjectName("Muted")
        self._lay.addWidget(lab)
        row = QHBoxLayout()
        row.setSpacing(4)
        b_in = QPushButton("New input")
        b_in.setToolTip(f"A program input feeding {name}")
        b_in.clicked.connect(lambda: self._new_source("input", nid, port))
        b_par = QPushButton(f"New parameter {_shape_text(shape)}" if shape else "New parameter")
        b_par.setToolTip(f"A parameter feeding {name}" + (f", shaped {_shape_text(shape)} as the op expects"
                                                           if shape else "; set its shape below"))
        b_par.clicked.connect(lambda: self._new_source("parameter", nid, port))
        pick = QComboBox()
        pick.addItem("connect a value…", None)
        for vid in self._connect_choices(nid):
            v = p.values[vid]
            pick.addItem(f"{v.name}  {fmt_spec(v.shape, v.dtype)}", vid)
        pick.activated.connect(lambda i: self._connect(nid, port, pick.itemData(i)))
        # sized by the dock, not by the longest value name: the inspector must not scroll sideways
        pick.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        pick.setMinimumContentsLength(10)
        row.addWidget(b_in)
        row.addWidget(b_par)
        row.addStretch(1)
        self._lay.addLayout(row)
        self._lay.addWidget(pick)
        self.port_actions[(port, "input")], self.port_actions[(port, "parameter")] = b_in, b_par
        self.port_actions[(port, "connect")] = pick

    def _connect_choices(self, nid: str) -> list[str]:
        """Values that could feed a port of nid: sources, then other nodes' outputs (can_connect
        decides when one is chosen; checking all of them here would cost a graph walk each)."""
        p = self.program
        own = set(p.nodes[nid].outputs)
        sources = [vid for vid, v in p.values.items() if v.producer is None]
        computed = [vid for n in p.nodes.values() if n.id != nid for vid in n.outputs if vid not in own]
        return (sources + computed)[:MAX_CONNECT_CHOICES]

    def _new_source(self, kind: str, nid: str, port: int) -> None:
        if self.stack is None or nid not in self.program.nodes:
            return
        _, reason = C.add_source(self.stack, self.program, kind, (nid, port))
        if reason and self.port_error is not None:
            self.port_error.setText(f"made, but not connected: {reason}")
            self.port_error.show()

    def _connect(self, nid: str, port: int, vid: str | None) -> None:
        if vid is None or nid not in self.program.nodes:
            return
        reason = self.program.can_connect(vid, nid, port)
        if reason:
            if self.port_error is not None:
                self.port_error.setText(reason)
                self.port_error.show()
            return
        self._push(C.SetInput(self.program, nid, port, vid))

    def _param(self, v) -> None:
        data = self.program.data.get(v.id)
        head = QLabel(f"<b>{v.name}</b>  {fmt_spec(v.shape, v.dtype)}  ·  {human_bytes(v.nbytes)}")
        self._lay.addWidget(head)
        self._source_editor(v)
        if data is None:
            text = "no data: drawn at random when the program runs"
        else:
            flat = np.asarray(data).reshape(-1)
            vals = ", ".join(f"{x:.4g}" if isinstance(x, (float, np.floating)) else str(x) for x in flat[:6])
            more = " …" if flat.size > 6 else ""
            stats = (f"  (min {flat.min():.3g}, max {flat.max():.3g}, mean {flat.mean():.3g})"
                     if flat.size and np.issubdtype(flat.dtype, np.number) else "")
            text = f"[{vals}{more}]{stats}"
        lab = QLabel(text)
        lab.setObjectName("Mono")
        lab.setWordWrap(True)
        self._lay.addWidget(lab)

    def _value(self, vid: str) -> None:
        p = self.program
        v = p.values[vid]
        what = {Role.INPUT: "program input", Role.PARAMETER: "parameter", Role.CONSTANT: "constant"}
        self._title(v.name, what.get(v.role, v.role.value) + f" · {fmt_spec(v.shape, v.dtype)} · "
                    f"{human_bytes(v.nbytes)}")
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignRight)
        name = QLineEdit(v.name)
        name.setObjectName("NameEdit")
        name.editingFinished.connect(lambda: self._rename(vid, name.text()))
        self.source_editors[(vid, "name")] = name
        form.addRow("name", name)
        self._lay.addLayout(form)
        if v.producer is None:
            self._source_editor(v)
        readers = p.consumers(vid)
        self._section(f"Read by ({len(readers)})")
        self._grid([[p.nodes[n].name, p.nodes[n].opdef.port_name(k)] for n, k in readers[:40]])

    # editing -------------------------------------------------------------------------------
    def _attr_editor(self, nid: str, a: Attr, value) -> QWidget:
        if a.kind == "bool":
            w = QCheckBox()
            w.setChecked(bool(value))
            w.toggled.connect(lambda on: self.commit_attr(nid, a, on))
            return w
        if a.choices:
            w = QComboBox()
            for c in a.choices:
                w.addItem(fmt_attr(c), c)
            w.setCurrentIndex(list(a.choices).index(value) if value in a.choices else 0)
            w.activated.connect(lambda i: self.commit_attr(nid, a, w.itemData(i)))
            return w
        w = QLineEdit("" if value is None else (json.dumps(value) if a.kind == "json" else fmt_attr(value)))
        w.setPlaceholderText("none" if a.optional else a.kind)
        w.editingFinished.connect(lambda: self.commit_attr(nid, a, parse_attr(a, w.text())))
        return w

    def commit_attr(self, nid: str, a: Attr, value) -> bool:
        """Validate with the op's rule; push one undo step if it is new, else show why not."""
        p = self.program
        node = p.nodes.get(nid)
        if node is None:
            return False
        msg = self.attr_errors.get(a.name)
        try:
            value = a.check(node.op, value)
        except StitchError as e:
            _show_error(msg, str(e))
            return False
        _show_error(msg, None)
        if node.attrs.get(a.name) == value:
            return True
        self._push(C.SetAttrs(p, nid, {a.name: value}))
        return True

    def _rename(self, ident: str, name: str) -> None:
        obj = self.program.nodes.get(ident) or self.program.values.get(ident)
        if obj is not None and name.strip() and name.strip() != obj.name:
            self._push(C.Rename(self.program, ident, name.strip()))

    # inputs, parameters and constants ---------------------------------------------------------------
    def _source_editor(self, v) -> None:
        """Shape and dtype (inputs, parameters), init with its numbers (parameters), the typed value
        (constants), and the line that says why an edit was refused."""
        vid = v.id
        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignRight)
        if v.role in (Role.INPUT, Role.PARAMETER):
            shape = QLineEdit(_shape_text(v.shape))
            shape.setPlaceholderText("8, 16")
            shape.setToolTip("Sizes separated by commas, e.g. 8, 16 or [8, 16]; [] is a scalar")
            shape.editingFinished.connect(lambda: self._edit_shape(vid, shape.text()))
            self.source_editors[(vid, "shape")] = shape
            form.addRow("shape", shape)
        dtype = QComboBox()
        for d in DTYPES:
            dtype.addItem(d, d)
        dtype.setCurrentIndex(list(DTYPES).index(v.dtype))
        dtype.activated.connect(lambda i: self.commit_source(vid, {"dtype": dtype.itemData(i)}, "dtype"))
        self.source_editors[(vid, "dtype")] = dtype
        form.addRow("dtype", dtype)
        if v.role == Role.PARAMETER:
            init = dict(v.init) if v.init else None
            kind = QComboBox()
            if init is None:
                kind.addItem("loaded data", None)
            for k in PARAMETER_INITS:
                kind.addItem(k, k)
            kind.setCurrentIndex(kind.findData(init["kind"]) if init else 0)
            kind.setToolTip("How the parameter's numbers are drawn (a fixed seed: the same numbers every time)")
            kind.activated.connect(lambda i: kind.itemData(i) and self._edit_init(vid, kind.itemData(i)))
            self.source_editors[(vid, "init")] = kind
            form.addRow("init", kind)
            for key in (PARAMETER_INITS[init["kind"]] if init else ()):
                num = QLineEdit(f"{init[key]:g}")
                num.editingFinished.connect(lambda key=key, num=num: self._edit_init_number(vid, key, num.text()))
                self.source_editors[(vid, key)] = num
                form.addRow(key, num)
        if v.role == Role.CONSTANT:
            data = self.program.data.get(vid)
            text = "" if data is None else json.dumps(np.asarray(data).tolist())
            value = QLineEdit(text if len(text) <= 2000 else "")
            value.setPlaceholderText("0.5 or [1, 2, 3]")
            value.setToolTip("A number, or nested lists of numbers; its shape follows what you type")
            value.editingFinished.connect(lambda: self._edit_value(vid, value.text()))
            self.source_editors[(vid, "value")] = value
            form.addRow("value", value)
        self._lay.addLayout(form)
        err = QLabel("")
        err.setObjectName("Error")
        err.setWordWrap(True)
        err.hide()
        self.source_errors[vid] = err
        self._lay.addWidget(err)

    def commit_source(self, vid: str, changes: dict, what: str) -> bool:
        """Check the edit on the model and push it as one undo step, else show why it was refused."""
        p = self.program
        v = p.values.get(vid)
        if v is None or self.stack is None:
            return False
        err = self.source_errors.get(vid)
        try:
            C.push_edit_source(self.stack, p, vid, changes, f"Edit {v.name}: {what}")
        except StitchError as e:
            _show_error(err, str(e))
            return False
        _show_error(err, None)
        return True

    def _refuse(self, vid: str, e: StitchError) -> bool:
        err = self.source_errors.get(vid)
        if err is not None:
            err.setText(f"{self.program.values[vid].name}: {e}")
            err.show()
        return False

    def _edit_shape(self, vid: str, text: str) -> bool:
        try:
            shape = parse_shape(text)
        except StitchError as e:
            return self._refuse(vid, e)
        if vid not in self.program.values or shape == self.program.values[vid].shape:
            return True
        return self.commit_source(vid, {"shape": shape}, f"shape {_shape_text(shape)}")

    def _edit_init(self, vid: str, kind: str) -> bool:
        v = self.program.values[vid]
        old = dict(v.init or {})
        init = {"kind": kind, **{k: old[k] for k in PARAMETER_INITS[kind] if k in old}}
        if init == old:
            return True
        return self.commit_source(vid, {"init": init}, f"init {kind}")

    def _edit_init_number(self, vid: str, key: str, text: str) -> bool:
        v = self.program.values.get(vid)
        if v is None or not v.init:
            return False
        try:
            x = float(text)
        except ValueError:
            return self._refuse(vid, ProgramError(f"init {key} must be a number, got '{text.strip()}'"))
        if v.init.get(key) == x:
            return True
        return self.commit_source(vid, {"init": {**v.init, key: x}}, f"init {key}={x:g}")

    def _edit_value(self, vid: str, text: str) -> bool:
        try:
            value = parse_value(text)
        except StitchError as e:
            return self._refuse(vid, e)
        data = self.program.data.get(vid)
        if data is not None and np.asarray(value).shape == data.shape and np.array_equal(np.asarray(value), data):
            return True
        return self.commit_source(vid, {"data": value}, "value")

    def _push(self, cmd) -> None:
        if self.stack is not None:
            self.stack.push(cmd)


def _show_error(label, text: str | None) -> None:
    """An editor's one-line refusal under it (None hides it); a row may have no label yet."""
    if label is None:
        return
    if text is None:
        label.hide()
    else:
        label.setText(text)
        label.show()
