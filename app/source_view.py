"""The Generated source dock: the CUDA of the selected region (or of every region), syntax highlighted,
with line numbers, the region's ops highlighted where the source names them and compile errors marked at
their line.

A region without stored source (planned, not yet optimized) is generated on demand through codegen for
display only: the model is not changed. Compile runs NVRTC (cached) on what is shown.
"""
from __future__ import annotations

import difflib
import re

from PySide6.QtCore import QRect, QRegularExpression, QSize, Qt
from PySide6.QtGui import (QColor, QFont, QFontDatabase, QPainter, QSyntaxHighlighter, QTextCharFormat, QTextCursor,
                           QTextFormat)
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSizePolicy, QTextEdit,
                               QVBoxLayout, QWidget)

from agent_core.text import plural

KEYWORDS = ("auto break case const constexpr continue default do else enum extern for if inline namespace "
            "return sizeof static struct switch template typedef typename union unsigned signed using void "
            "volatile while int float double char bool long short half float2 float4 int4 index_t true false "
            "__global__ __device__ __host__ __shared__ __restrict__ __forceinline__ __launch_bounds__ "
            "__syncthreads __syncwarp").split()
BUILTINS = ("threadIdx blockIdx blockDim gridDim warpSize __shfl_xor_sync __shfl_down_sync __ldg fmaxf fminf "
            "expf logf sqrtf rsqrtf tanhf erff fabsf powf __expf __int_as_float").split()
ERROR_LINE = re.compile(r"(?:compile error at line|line)\s+(\d+)")


def _fmt(color: str, bold=False, italic=False) -> QTextCharFormat:
    f = QTextCharFormat()
    f.setForeground(QColor(color))
    if bold:
        f.setFontWeight(QFont.Bold)
    f.setFontItalic(italic)
    return f


class CudaHighlighter(QSyntaxHighlighter):
    """CUDA C++: keywords, CUDA builtins, numbers, strings, preprocessor lines and comments (// and
    /* */ across lines)."""

    def __init__(self, doc, dark: bool = True):
        super().__init__(doc)
        self.set_theme(dark)

    def set_theme(self, dark: bool) -> None:
        c = (dict(kw="#c678dd", bi="#56b6c2", num="#d19a66", str="#98c379", pre="#e5c07b", com="#7f848e")
             if dark else dict(kw="#a626a4", bi="#0184bc", num="#986801", str="#50a14f", pre="#c18401",
                               com="#8e908c"))
        self.rules = [(QRegularExpression(r"\b(" + "|".join(map(re.escape, KEYWORDS)) + r")\b"), _fmt(c["kw"], True)),
                      (QRegularExpression(r"\b(" + "|".join(BUILTINS) + r")\b"), _fmt(c["bi"])),
                      (QRegularExpression(r"\b[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?[fFuUlL]*\b"), _fmt(c["num"])),
                      (QRegularExpression(r'"[^"\n]*"'), _fmt(c["str"])),
                      (QRegularExpression(r"^\s*#\s*\w+"), _fmt(c["pre"])),
                      (QRegularExpression(r"//[^\n]*"), _fmt(c["com"], italic=True))]
        self.comment = _fmt(c["com"], italic=True)
        self.rehighlight()

    def highlightBlock(self, text: str) -> None:
        for rx, fmt in self.rules:
            it = rx.globalMatch(text)
            while it.hasNext():
                m = it.next()
                self.setFormat(m.capturedStart(), m.capturedLength(), fmt)
        # block comments may span lines: state 1 = inside one
        self.setCurrentBlockState(0)
        start = 0 if self.previousBlockState() == 1 else text.find("/*")
        while start >= 0:
            end = text.find("*/", start)
            if end < 0:
                self.setCurrentBlockState(1)
                self.setFormat(start, len(text) - start, self.comment)
                break
            self.setFormat(start, end + 2 - start, self.comment)
            start = text.find("/*", end + 2)


class LineNumbers(QWidget):
    """The gutter beside a CodeEdit: one number per line, as wide as the largest number needs."""

    def __init__(self, edit: "CodeEdit"):
        super().__init__(edit)
        self.edit = edit

    def sizeHint(self) -> QSize:
        return QSize(self.edit.gutter_width(), 0)

    def paintEvent(self, ev) -> None:
        self.edit.paint_gutter(ev)


class CodeEdit(QPlainTextEdit):
    """A read-only code view with line numbers in a gutter (the pattern of Qt's Code Editor example);
    the line marked as a compile error has its number in red."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.gutter = LineNumbers(self)
        self.marked_line: int | None = None   # 1-based
        self.blockCountChanged.connect(lambda _n: self._fit_gutter())
        self.updateRequest.connect(self._scroll_gutter)
        self._fit_gutter()

    def gutter_width(self) -> int:
        digits = max(2, len(str(max(1, self.blockCount()))))
        return 10 + self.fontMetrics().horizontalAdvance("9") * digits

    def _fit_gutter(self) -> None:
        self.setViewportMargins(self.gutter_width(), 0, 0, 0)

    def _scroll_gutter(self, rect, dy) -> None:
        if dy:
            self.gutter.scroll(0, dy)
        else:
            self.gutter.update(0, rect.y(), self.gutter.width(), rect.height())
        if rect.contains(self.viewport().rect()):
            self._fit_gutter()

    def changeEvent(self, ev):
        super().changeEvent(ev)
        from PySide6.QtCore import QEvent
        if ev.type() == QEvent.FontChange:
            self._fit_gutter()

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        cr = self.contentsRect()
        self.gutter.setGeometry(QRect(cr.left(), cr.top(), self.gutter_width(), cr.height()))

    def visible_line_numbers(self) -> list[int]:
        """The numbers the gutter shows now (1-based), top to bottom."""
        out, block = [], self.firstVisibleBlock()
        top = self.blockBoundingGeometry(block).translated(self.contentOffset()).top()
        height = self.viewport().height()
        while block.isValid() and top <= height:
            if block.isVisible():
                out.append(block.blockNumber() + 1)
            top += self.blockBoundingRect(block).height()
            block = block.next()
        return out

    def paint_gutter(self, ev) -> None:
        p = QPainter(self.gutter)
        pal = self.palette()
        p.fillRect(ev.rect(), pal.alternateBase())
        dim, err = pal.placeholderText().color(), QColor("#e06c6c")
        block = self.firstVisibleBlock()
        top = round(self.blockBoundingGeometry(block).translated(self.contentOffset()).top())
        line_h = self.fontMetrics().height()
        w = self.gutter.width() - 5
        while block.isValid() and top <= ev.rect().bottom():
            bottom = top + round(self.blockBoundingRect(block).height())
            if block.isVisible() and bottom >= ev.rect().top():
                n = block.blockNumber() + 1
                p.setPen(err if n == self.marked_line else dim)
                p.drawText(0, top, w, line_h, Qt.AlignRight, str(n))
            block, top = block.next(), bottom
        p.end()


class ElidedLabel(QLabel):
    """One line that never widens its dock: the text elided to the label's width, all of it in the
    tooltip; text() is the full text."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(parent)
        self.full = ""
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:
        self.full = text
        self._elide()

    def text(self) -> str:
        return self.full

    def shown_text(self) -> str:
        return super().text()

    def minimumSizeHint(self) -> QSize:
        return QSize(40, super().minimumSizeHint().height())

    def resizeEvent(self, ev):
        super().resizeEvent(ev)
        self._elide()

    def _elide(self) -> None:
        shown = self.fontMetrics().elidedText(self.full, Qt.ElideRight, max(self.width(), 40))
        super().setText(shown)
        self.setToolTip(self.full if shown != self.full else "")


def show_diff(edit: QPlainTextEdit, text: str) -> None:
    """A unified diff in `edit`, added lines on green, removed ones on red, hunk headers on blue."""
    edit.setPlainText(text)
    sels = []
    for i, line in enumerate(text.splitlines()):
        if line[:3] in ("+++", "---"):
            continue
        color = {"+": QColor(60, 180, 90, 60), "-": QColor(220, 60, 60, 60), "@": QColor(80, 140, 230, 50)}.get(line[:1])
        if color is not None:
            sel = QTextEdit.ExtraSelection()
            sel.format.setBackground(color)
            sel.format.setProperty(QTextFormat.FullWidthSelection, True)
            sel.cursor = QTextCursor(edit.document().findBlockByNumber(i))
            sels.append(sel)
    edit.setExtraSelections(sels)


def writer_note(region) -> str | None:
    """What the region's decision log says of the model-written kernel it now runs, if it does."""
    last = next((e for e in reversed(region.log or []) if e.get("actor") == "writer"), None)
    if last is not None and last.get("action") == "kept":
        return f"written by the model and kept: {last.get('message', '')}"
    return None


# what the empty editor says until a region is picked (drawn word-wrapped inside the editor, where it fits)
PICK_A_REGION = "Click a region on the canvas, in the Regions list or in a plot to see its CUDA here."


class SourceView(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.program = None
        self.region_id: str | None = None
        self.error_line: int | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        top = QHBoxLayout()
        self.scope = QComboBox()
        self.scope.addItems(["Region", "Program"])   # short: the row must fit the dock beside the profiles
        self.scope.setToolTip("Show the selected region's kernel, or every region's")
        self.scope.currentIndexChanged.connect(lambda _i: self.refresh())
        self.title = ElidedLabel("No region selected")
        self.title.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.variant = QComboBox()
        self.variant.setToolTip("Compare this kernel with a tuning variant (a unified diff)")
        self.variant.setMinimumContentsLength(8)   # its list shows each whole; the closed box must not widen the dock
        self.variant.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.variant.currentIndexChanged.connect(self._variant_changed)
        self.variants: list[dict] = []
        self.trials_for = lambda region_id: []   # measured tune steps of a region (the studio sets this)
        self.compile_btn = QPushButton("Compile")
        self.compile_btn.setToolTip("Compile what is shown with NVRTC (sm_90 without a GPU) and mark any error")
        self.compile_btn.clicked.connect(self.compile_shown)
        top.addWidget(self.scope)
        top.addWidget(self.title, 1)
        top.addWidget(self.variant)
        top.addWidget(self.compile_btn)
        lay.addLayout(top)
        self.edit = CodeEdit()
        self.edit.setReadOnly(True)
        self.edit.setLineWrapMode(QPlainTextEdit.NoWrap)
        font = QFontDatabase.systemFont(QFontDatabase.FixedFont)
        font.setPointSize(max(font.pointSize(), 9))
        self.edit.setFont(font)
        self.highlighter = CudaHighlighter(self.edit.document(), dark=self._dark())
        lay.addWidget(self.edit, 1)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)

    def _dark(self) -> bool:
        return self.palette().base().color().lightness() < 128

    def changeEvent(self, ev):
        from PySide6.QtCore import QEvent
        if ev.type() == QEvent.PaletteChange and hasattr(self, "highlighter"):
            self.highlighter.set_theme(self._dark())
            self._mark_error()
        super().changeEvent(ev)

    # what is shown -----------------------------------------------------------------------------
    def set_program(self, program) -> None:
        self.program = program
        self.region_id = None
        self.error_line = None
        self.refresh()

    def show_region(self, region_id: str | None) -> None:
        self.region_id = region_id
        self.error_line = None
        if self.scope.currentIndex() != 0:
            self.scope.setCurrentIndex(0)   # refreshes
        else:
            self.refresh()

    def region_source(self, region) -> tuple[str | None, str]:
        """(source, where it came from) of a region: stored by the agent, or generated now."""
        if region.source:
            return region.source, writer_note(region) or "generated by the agent"
        from agent_core.agent.loop import kernel_name
        from agent_core.errors import StitchError
        from agent_core.codegen import generate_kernel
        try:
            ks = generate_kernel(self.program, region.nodes, name=kernel_name(self.program, region.id),
                                 kind=region.kind)
        except StitchError as e:
            return None, f"no kernel is generated for this region: {e}"
        except Exception as e:   # a generator bug: say so rather than show nothing
            return None, f"the generator failed ({type(e).__name__}: {e})"
        return ks.source, "generated on demand for viewing (Optimize stores it)"

    def refresh(self) -> None:
        from agent_core.regions import active_regions
        p = self.program
        text, note = "", ""
        self._fill_variants(None)
        if p is None:
            self.title.setText("No program")
        elif self.scope.currentIndex() == 1:
            parts = []
            for r in active_regions(p):
                src, why = self.region_source(r)
                parts.append(f"// ===== {r.id} ({r.kind}) =====\n" + (src or f"// {why}\n"))
            text = "\n".join(parts)
            self.title.setText(f"{p.name}: {plural(len(parts), 'region')}")
            note = "" if parts else "No regions yet: Plan or Optimize first."
        elif self.region_id is None:
            self.title.setText("No region selected")
        else:
            r = next((x for x in p.regions if x.id == self.region_id), None)
            if r is None:
                self.title.setText(f"Region {self.region_id} no longer exists")
            else:
                src, note = self.region_source(r)
                text = src or ""
                self._fill_variants(r if src else None)
                ops = ", ".join(f"{p.nodes[n].name} ({p.nodes[n].op})" for n in r.nodes if n in p.nodes)
                self.title.setText(f"{r.id} · {r.kind.replace('_', ' ')} · {ops}")
        self.edit.setPlaceholderText(PICK_A_REGION if p is not None and self.region_id is None
                                     and self.scope.currentIndex() == 0 else "")
        self.edit.setPlainText(text)
        self.status.setText(note)
        self._mark_error()

    def show_text(self, title: str, source: str, note: str) -> None:
        """Show a source that is not the region's (a model's proposal); refresh() goes back to the region's."""
        self._fill_variants(None)
        self.error_line = None
        self.title.setText(title)
        self.edit.setPlaceholderText("")
        self.edit.setPlainText(source)
        self.status.setText(note)
        self._mark_error()

    # tuning variants ---------------------------------------------------------------------------------
    def _fill_variants(self, region) -> None:
        """The variants of `region`'s kernel: the trials the agent measured (with their times), else
        the tuning space codegen offers for it."""
        self.variant.blockSignals(True)
        self.variant.clear()
        self.variants = []
        if region is not None:
            steps = [t for t in self.trials_for(region.id) if t.trial > 0]
            if steps:
                self.variants = [dict(t.params) for t in steps]
                labels = [f"vs trial {t.trial}" + (f" ({t.ms * 1e3:.1f} us)" if t.ms else " (rejected)") for t in steps]
            else:
                self.variants = self._tune_space(region)
                labels = [f"vs variant {i + 1}" for i in range(len(self.variants))]
            if self.variants:
                self.variant.addItem("This kernel")
                for label, params in zip(labels, self.variants):
                    self.variant.addItem(label)
                    self.variant.setItemData(self.variant.count() - 1, str(params), Qt.ToolTipRole)
        self.variant.setVisible(bool(self.variants))
        self.variant.blockSignals(False)

    def _kernel(self, region, params=None):
        from agent_core.agent.loop import kernel_name
        from agent_core.codegen import generate_kernel
        return generate_kernel(self.program, region.nodes, name=kernel_name(self.program, region.id),
                               kind=region.kind, params=params)

    def _tune_space(self, region) -> list[dict]:
        from agent_core.agent.tune import tune_space
        try:
            return tune_space(self._kernel(region))
        except Exception:   # no kernel for this region: nothing to compare
            return []

    def _variant_changed(self, index: int) -> None:
        r = next((x for x in (self.program.regions if self.program else []) if x.id == self.region_id), None)
        if r is None or index <= 0:
            self.variant.blockSignals(True)
            self.refresh()
            self.variant.setCurrentIndex(0)
            self.variant.blockSignals(False)
            return
        params = self.variants[index - 1]
        base, _ = self.region_source(r)
        try:
            other = self._kernel(r, params).source
        except Exception as e:
            self.status.setText(f"Variant {params} cannot be generated: {e}")
            return
        diff = list(difflib.unified_diff((base or "").splitlines(), other.splitlines(), "this kernel",
                                         f"variant {params}", lineterm="", n=2))
        show_diff(self.edit, "\n".join(diff) if diff else "// the variant's source is identical")
        self.status.setText(f"Diff against the variant with {params}")

    # compile errors ------------------------------------------------------------------------------
    def show_compile_error(self, message: str, line: int | None = None) -> None:
        """Mark `line` (or the line the message names) in what is shown and say what went wrong."""
        if line is None:
            m = ERROR_LINE.search(message)
            line = int(m.group(1)) if m else None
        self.error_line = line
        self.status.setText(f"Compile error: {message}")
        self._mark_error()

    def _mark_error(self) -> None:
        sels = []
        self.edit.marked_line = self.error_line
        self.edit.gutter.update()
        if self.error_line:
            block = self.edit.document().findBlockByNumber(self.error_line - 1)
            if block.isValid():
                sel = QTextEdit.ExtraSelection()
                sel.format.setBackground(QColor(220, 60, 60, 90))
                sel.format.setProperty(QTextFormat.FullWidthSelection, True)
                sel.format.setToolTip(self.status.text())
                sel.cursor = QTextCursor(block)
                sels.append(sel)
                self.edit.setTextCursor(QTextCursor(block))
                self.edit.centerCursor()
        self.edit.setExtraSelections(sels)

    def compile_shown(self) -> bool:
        """Compile the shown source; marks the error line on failure. True if it compiled."""
        from agent_core.compiler import CompileError, compile_source
        src = self.edit.toPlainText()
        if not src.strip() or self.scope.currentIndex() == 1:
            self.status.setText("Select one region with generated source to compile it")
            return False
        name = f"region_{self.region_id}"
        try:
            c = compile_source(src, name, arch="sm_90")
        except CompileError as e:
            self.show_compile_error(str(e), e.line)
            return False
        except Exception as e:   # NVRTC missing or broken: say so
            self.status.setText(f"Could not compile: {type(e).__name__}: {e}")
            return False
        self.error_line = None
        self._mark_error()
        self.status.setText(f"Compiled: {c.summary()}" if hasattr(c, "summary") else "Compiled")
        return True
