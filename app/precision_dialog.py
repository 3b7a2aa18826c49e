"""Agent > Precision and Tolerance…: the tolerance every result of the program is verified within, and
the lower precisions its matmuls and convolutions may run in (docs/OPTIMIZE.md#the-programs-tolerance).

Both live in the program (metadata "tolerance" and "allow_precision"), so they are saved with it and
the worker's Optimize reads them; Save applies them as one undo step. Not modal: the studio stays usable.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QVBoxLayout

from agent_core.errors import StitchError
from agent_core.ir import Program
from agent_core.runtime.low_precision import DESCRIPTIONS, FORMS, allowed
from agent_core.verify import ATOL, RTOL, tolerance, tolerance_value
from graph_editor.commands import SetMetadata

LABELS = {"tf32": "TF32", "fp16": "fp16", "bf16": "bf16"}


def parse_tolerance(text: str, what: str) -> tuple[float | None, str]:
    """(value, "") for what the program file takes (verify.tolerance_value), else (None, why not)."""
    try:
        return tolerance_value(what, float(text.strip())), ""
    except ValueError:
        return None, f"{what} must be a number, like 1e-3"
    except StitchError as exc:
        return None, str(exc)


class PrecisionDialog(QDialog):
    saved = Signal(str)        # what changed, for the status bar

    def __init__(self, program: Program, stack, parent=None):
        super().__init__(parent)
        self.program, self.stack = program, stack
        self.setWindowTitle("Precision and Tolerance")
        atol, rtol = tolerance(program)
        intro = QLabel("Every result is verified against the fp32 reference within |got − want| ≤ atol + "
                       "rtol·|want| on random draws. KernelBench's fp32 tolerance is 1e-4.")
        intro.setWordWrap(True)
        self.atol, self.rtol = QLineEdit(f"{atol:g}"), QLineEdit(f"{rtol:g}")
        form = QFormLayout()
        form.addRow("atol", self.atol)
        form.addRow("rtol", self.rtol)
        lower = QLabel("Matmuls and convolutions may also run in these lower precisions. Each is timed beside "
                       "fp32 and split TF32 and kept only where it is faster and agrees with fp32 within the "
                       "tolerance (at 1e-4 it rarely does):")
        lower.setWordWrap(True)
        on = set(allowed(program))
        self.forms = {}
        for f in FORMS:
            box = QCheckBox(DESCRIPTIONS[f])
            box.setChecked(f in on)
            self.forms[f] = box
        self.problem = QLabel("")
        self.problem.setObjectName("Refusal")
        self.problem.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel
                                        | QDialogButtonBox.RestoreDefaults)
        self.buttons.button(QDialogButtonBox.RestoreDefaults).setText("fp32 at 1e-4")
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        self.buttons.button(QDialogButtonBox.RestoreDefaults).clicked.connect(self.defaults)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(lower)
        for box in self.forms.values():
            layout.addWidget(box)
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)
        for edit in (self.atol, self.rtol):
            edit.textChanged.connect(self._check)
        self._check()

    def _values(self) -> tuple[float | None, float | None, str]:
        atol, why_a = parse_tolerance(self.atol.text(), "atol")
        rtol, why_r = parse_tolerance(self.rtol.text(), "rtol")
        return atol, rtol, why_a or why_r

    def _check(self) -> None:
        *_, why = self._values()
        self.problem.setText(why)
        save = self.buttons.button(QDialogButtonBox.Save)
        save.setEnabled(not why)
        save.setToolTip(why)

    def defaults(self) -> None:
        self.atol.setText(f"{ATOL:g}")
        self.rtol.setText(f"{RTOL:g}")
        for box in self.forms.values():
            box.setChecked(False)

    def save(self) -> None:
        atol, rtol, why = self._values()
        if why:
            return
        forms = [f for f, box in self.forms.items() if box.isChecked()]
        changes = {"tolerance": None if (atol, rtol) == (ATOL, RTOL) else {"atol": atol, "rtol": rtol},
                   "allow_precision": forms or None}
        meta = self.program.metadata
        if any(meta.get(k) != v for k, v in changes.items()):
            self.stack.push(SetMetadata(self.program, changes, "Set precision and tolerance"))
            self.saved.emit(f"Verified within atol {atol:g}, rtol {rtol:g}"
                            + (f"; lower precisions allowed: {', '.join(LABELS[f] for f in forms)}" if forms else
                               "; matmuls and convolutions in fp32 or split TF32"))
        self.accept()
