"""The inspector: what is selected, in full. For a node: op, name, editable attributes (validated by
the op's Attr before any command is pushed), input and output shapes and dtypes, bytes and FLOPs,
parameters with a small preview. For a program input: its spec and readers. For nothing: the
program's summary and its diagnostics."""
from __future__ import annotations

import json

import numpy as np
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QFrame, QGridLayout, QLabel,
                               QLineEdit, QScrollArea, QVBoxLayout, QWidget)

from agent_core.errors import StitchError
from agent_core.ir import Program, Role
from agent_core.ops import Attr

from . import commands as C
from .node_item import fmt_attr, fmt_spec


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
        self._title(p.name, f"{len(p.nodes)} nodes · {len(p.values)} values")
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
        rows = []
        for i in range(max(len(node.inputs), len(opdef.inputs) if opdef else 0)):
            vid = node.inputs[i] if i < len(node.inputs) else None
            port = opdef.port_name(i) if opdef else f"in{i}"
            v = p.values.get(vid) if vid else None
            if v is None:
                rows.append([port, "—", "unconnected", ""])
            else:
                rows.append([port, v.name, fmt_spec(v.shape, v.dtype), v.role.value])
        self._grid(rows, ["port", "value", "spec", "role"])
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

    def _param(self, v) -> None:
        data = self.program.data.get(v.id)
        head = QLabel(f"<b>{v.name}</b>  {fmt_spec(v.shape, v.dtype)}  ·  {human_bytes(v.nbytes)}")
        self._lay.addWidget(head)
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
        self._title(v.name, f"program {v.role.value}")
        self._grid([["shape", fmt_spec(v.shape, v.dtype)], ["bytes", human_bytes(v.nbytes)],
                    ["init", json.dumps(v.init) if v.init else "normal"]])
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
            if msg is not None:
                msg.setText(str(e))
                msg.show()
            return False
        if msg is not None:
            msg.hide()
        if node.attrs.get(a.name) == value:
            return True
        self._push(C.SetAttrs(p, nid, {a.name: value}))
        return True

    def _rename(self, nid: str, name: str) -> None:
        node = self.program.nodes.get(nid)
        if node is not None and name.strip() and name != node.name:
            self._push(C.Rename(self.program, nid, name.strip()))

    def _push(self, cmd) -> None:
        if self.stack is not None:
            self.stack.push(cmd)
