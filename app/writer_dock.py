"""The Kernel writer dock: the model's conversation per region and round (what was sent, the reply
as it streams in, then in full), each round's verdict (the check that decided it and why, its time
against ours) and the diff of the proposal against our kernel. Fed by the writer-* events of a run,
live or replayed (docs/EVENTS.md); it never changes the document."""
from __future__ import annotations

from dataclasses import dataclass, field

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontDatabase, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSplitter, QTabWidget, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from agent_core.text import plural

from .source_view import CodeEdit, show_diff

OK, BAD, BUSY = QColor("#5fb878"), QColor("#e06c6c"), QColor("#d6a84a")
ROUND = Qt.UserRole                       # (region, round) of a tree row; round 0 is the region's row
HINT = ("Select a region, then Agent > Ask the Model for the Selected Region: the conversation, each "
        "round's verdict and the diff against our kernel appear here.")


@dataclass
class Round:
    messages: list = field(default_factory=list)    # what was sent (role + content)
    reply: str = ""                                 # streamed so far, then the whole reply
    reply_event: dict | None = None                 # tokens, seconds, finish reason
    verdict: dict | None = None


@dataclass
class Talk:
    """One region's conversation with the model."""
    rounds: dict = field(default_factory=dict)      # round number -> Round
    request: dict | None = None                     # the first writer-request: model, endpoint, remote
    done: dict | None = None


def us(ms) -> str:
    return "?" if ms is None else f"{ms * 1e3:.1f} us"


def verdict_line(v: dict) -> str:
    """'ok' or the check that rejected it, the reason's first line, and the time against ours."""
    reason = (str(v.get("reason") or "").strip().splitlines() or [""])[0]
    timing = f" · {us(v.get('ms'))} vs ours {us(v.get('ours_ms'))}" if v.get("ms") is not None else ""
    return f"{'passed' if v.get('ok') else 'rejected: ' + str(v.get('check'))}{timing} · {reason}"


def proposed_source(reply: str) -> str | None:
    """The CUDA the model's reply holds (its first whole fenced code block, read as the gate reads it)."""
    from agent_core.writer.proposal import CODE_LANGS, fenced_blocks
    return next((body for lang, body in fenced_blocks(reply or "") if lang in CODE_LANGS and body), None)


class WriterDock(QWidget):
    show_source = Signal(str, str, str)   # title, CUDA source, note: for the Generated source dock

    def __init__(self, parent=None):
        super().__init__(parent)
        self.talks: dict[str, Talk] = {}
        self.secrets: set[str] = set()    # never shown, whatever an event holds (the studio's stored key)
        self.follow = True                # the newest round is shown as it arrives, until the user picks one
        self._shown: tuple[str, int] | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.notice = QLabel(HINT)
        self.notice.setObjectName("WriterNotice")
        self.notice.setWordWrap(True)
        lay.addWidget(self.notice)
        split = self.split = QSplitter(Qt.Horizontal)
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Round", "Verdict"])
        self.tree.setColumnWidth(0, self.fontMetrics().horizontalAdvance("r999 · round 10") + 24)
        self.tree.setTextElideMode(Qt.ElideRight)
        self.tree.currentItemChanged.connect(lambda cur, _prev: self._picked(cur))
        self.tree.itemClicked.connect(lambda _it, _c: setattr(self, "follow", False))
        split.addWidget(self.tree)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        self.verdict = QLabel("")
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextSelectableByMouse)
        head.addWidget(self.verdict, 1)
        self.source_btn = QPushButton("Show in Generated source")
        self.source_btn.setToolTip("Show this round's proposed kernel in the Generated source dock")
        self.source_btn.clicked.connect(self._show_in_source)
        self.source_btn.setEnabled(False)
        head.addWidget(self.source_btn, 0, Qt.AlignTop)
        rl.addLayout(head)
        mono = QFontDatabase.systemFont(QFontDatabase.FixedFont)
        mono.setPointSize(max(mono.pointSize(), 9))
        self.tabs = QTabWidget()
        self.conversation = QPlainTextEdit()
        self.conversation.setReadOnly(True)
        self.conversation.setFont(mono)
        self.conversation.setPlaceholderText("No conversation yet.")
        self.diff = CodeEdit()
        self.diff.setReadOnly(True)
        self.diff.setFont(mono)
        self.diff.setLineWrapMode(QPlainTextEdit.NoWrap)
        self.diff.setPlaceholderText("The diff of a proposal against our kernel appears once its round has a verdict.")
        self.tabs.addTab(self.conversation, "Conversation")
        self.tabs.addTab(self.diff, "Diff against ours")
        rl.addWidget(self.tabs, 1)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([240, 760])
        lay.addWidget(split, 1)
        self._bold = QTextCharFormat()
        self._bold.setFontWeight(QFont.Bold)
        self._plain = QTextCharFormat()

    # the run's events ---------------------------------------------------------------------------
    def clear(self) -> None:
        self.talks.clear()
        self.tree.clear()
        self._shown = None
        self.follow = True
        self._show(None)

    def begin(self, region: str, notice: str) -> None:
        """A new ask for `region`: its earlier conversation is forgotten, the notice says where it goes."""
        self.talks.pop(region, None)
        item = self._region_item(region, create=False)
        if item is not None:
            self.tree.takeTopLevelItem(self.tree.indexOfTopLevelItem(item))
        self.follow = True
        self.set_notice(notice)

    def set_notice(self, text: str, remote: bool | None = None) -> None:
        """The line above the conversation; a remote endpoint's (what leaves the machine) stands out."""
        self.notice.setText(self._clean(text))
        remote = ("are sent to" in text) if remote is None else remote
        self.notice.setStyleSheet(f"color: {BUSY.name()};" if remote else "")

    def apply(self, e: dict) -> None:
        """One writer-* event; others are ignored."""
        k, rid = e.get("event"), e.get("region")
        if not (isinstance(k, str) and k.startswith("writer-")) or not rid:
            return
        talk = self.talks.setdefault(rid, Talk())
        if k == "writer-done":
            talk.done = e
            self._refresh_region(rid)
            if self._shown == (rid, 0) or (self.follow and self._shown and self._shown[0] == rid):
                self._show(self._shown)
            return
        n = e.get("round")
        if not isinstance(n, int):
            return
        rnd = talk.rounds.setdefault(n, Round())
        if k == "writer-request":
            rnd.messages = [m for m in (e.get("messages") or []) if isinstance(m, dict)]
            if talk.request is None:   # where this conversation goes, as the run says it
                talk.request = e
                where = f"{e.get('model')} at {e.get('endpoint')}"
                if e.get("remote"):
                    self.set_notice(f"{where}: the region's ops, shapes and our kernel source are sent to "
                                    f"{e.get('endpoint')}; weights and data are not.", True)
                else:
                    self.set_notice(f"{where}, on this machine: nothing leaves it.", False)
            rnd.reply, rnd.reply_event, rnd.verdict = "", None, None
        elif k == "writer-delta":
            text = str(e.get("text") or "")
            rnd.reply += text
            if self._shown == (rid, n) and rnd.reply_event is None:
                self._append(self._clean(text))
                return
        elif k == "writer-reply":
            rnd.reply, rnd.reply_event = str(e.get("text") or ""), e
        elif k == "writer-verdict":
            rnd.verdict = e
        item = self._round_item(rid, n)
        self._refresh_round(item, rid, n)
        self._refresh_region(rid)
        if self.follow and k == "writer-request":
            self.tree.setCurrentItem(item)   # shows it
        elif self._shown == (rid, n):
            self._show((rid, n))

    # the tree --------------------------------------------------------------------------------------
    def _region_item(self, rid: str, create: bool = True) -> QTreeWidgetItem | None:
        for i in range(self.tree.topLevelItemCount()):
            it = self.tree.topLevelItem(i)
            if it.data(0, ROUND) == (rid, 0):
                return it
        if not create:
            return None
        it = QTreeWidgetItem([rid, ""])
        it.setData(0, ROUND, (rid, 0))
        self.tree.addTopLevelItem(it)
        it.setExpanded(True)
        return it

    def _round_item(self, rid: str, n: int) -> QTreeWidgetItem:
        parent = self._region_item(rid)
        for i in range(parent.childCount()):
            if parent.child(i).data(0, ROUND) == (rid, n):
                return parent.child(i)
        it = QTreeWidgetItem([f"round {n}", ""])
        it.setData(0, ROUND, (rid, n))
        parent.addChild(it)
        parent.setExpanded(True)
        return it

    def _refresh_round(self, item: QTreeWidgetItem, rid: str, n: int) -> None:
        rnd = self.talks[rid].rounds[n]
        if rnd.verdict is not None:
            v = rnd.verdict
            text, color = ("passed" if v.get("ok") else str(v.get("check"))), OK if v.get("ok") else BAD
            if v.get("ms") is not None:
                text += f" {us(v.get('ms'))}"
        else:
            text, color = ("checking…" if rnd.reply_event else "answering…"), BUSY
        item.setText(1, text)
        item.setForeground(1, color)
        item.setToolTip(1, self._clean(verdict_line(rnd.verdict)) if rnd.verdict else text)

    def _refresh_region(self, rid: str) -> None:
        it = self._region_item(rid)
        done = self.talks[rid].done
        if done is None:
            it.setText(1, "asking…")
            it.setForeground(1, BUSY)
            return
        it.setText(1, "model kernel kept" if done.get("kept") else "ours kept")
        it.setForeground(1, OK if done.get("kept") else QColor("#9aa3b0"))
        it.setToolTip(1, self._clean(str(done.get("reason") or "")))

    def _picked(self, item) -> None:
        self._show(item.data(0, ROUND) if item is not None else None)

    # what is shown -----------------------------------------------------------------------------------
    def _show(self, key) -> None:
        self._shown = key
        self.conversation.clear()
        self.source_btn.setEnabled(False)
        if key is None or key[0] not in self.talks:
            self.verdict.setText("")
            self.diff.setPlainText("")
            return
        rid, n = key
        talk = self.talks[rid]
        if n == 0 or n not in talk.rounds:
            self._show_region(rid, talk)
            return
        rnd = talk.rounds[n]
        v = rnd.verdict
        self._set_verdict(f"{rid} · round {n}: " + (verdict_line(v) if v else "waiting for the reply and its checks"),
                          None if v is None else bool(v.get("ok")))
        prev = talk.rounds.get(n - 1)
        start = 0
        if prev is not None and prev.messages and rnd.messages[:len(prev.messages)] == prev.messages:
            start = len(prev.messages)
            self._write(f"Round {n} sends the conversation of round {n - 1} again, then:\n\n", self._bold)
        for m in rnd.messages[start:]:
            if m.get("role") == "assistant" and prev is not None and m.get("content") == prev.reply:
                continue   # round n-1's reply, shown in its round
            self._write(f"▌ sent ({m.get('role')})\n", self._bold)
            self._write(str(m.get("content") or "") + "\n\n", self._plain)
        r = rnd.reply_event
        if r is None:
            self._write("▌ reply (streaming…)\n", self._bold)
        else:
            cut = f", cut off ({r.get('finish_reason')})" if r.get("finish_reason") not in (None, "stop") else ""
            secs = f" in {r['seconds']:.1f} s" if isinstance(r.get("seconds"), (int, float)) else ""
            self._write(f"▌ reply ({plural(r.get('completion_tokens') or 0, 'token')}{secs}{cut})\n", self._bold)
        self._write(rnd.reply, self._plain)
        diff = (v or {}).get("diff")
        if v is None:
            self.diff.setPlainText("")
        else:
            show_diff(self.diff, self._clean(diff) if diff else "// no proposal could be read from this reply")
        self.source_btn.setEnabled(proposed_source(rnd.reply) is not None)
        bar = self.conversation.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _show_region(self, rid: str, talk: Talk) -> None:
        done = talk.done
        self.diff.setPlainText("")
        if done is None:
            self._set_verdict(f"{rid}: asking the model ({plural(len(talk.rounds), 'round')} so far)", None)
        else:
            self._set_verdict(f"{rid}: {'model kernel kept' if done.get('kept') else 'ours kept'} · "
                              f"{done.get('reason')}", True if done.get("kept") else None)   # ours kept is no failure
        req = talk.request or {}
        self._write(f"{rid}: {req.get('model', '?')} at {req.get('endpoint', '?')}"
                    + (" (remote)" if req.get("remote") else " (this machine)") + "\n\n", self._bold)
        for n in sorted(talk.rounds):
            v = talk.rounds[n].verdict
            self._write(f"round {n}: {verdict_line(v) if v else '…'}\n", self._plain)
        if done is not None:
            tokens = f", {plural(done['tokens'], 'token')}" if done.get("tokens") is not None else ""
            self._write(f"\n{done.get('reason')}{tokens}\n", self._plain)

    def _set_verdict(self, text: str, ok: bool | None) -> None:
        self.verdict.setText(self._clean(text))
        color = "" if ok is None else (OK if ok else BAD).name()
        self.verdict.setStyleSheet(f"color: {color}; font-weight: bold;" if color else "font-weight: bold;")

    def _write(self, text: str, fmt: QTextCharFormat) -> None:
        cur = self.conversation.textCursor()
        cur.movePosition(QTextCursor.End)
        cur.insertText(self._clean(text), fmt)

    def _append(self, text: str) -> None:
        bar = self.conversation.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        self._write(text, self._plain)
        if at_end:   # keep following the reply unless the user scrolled up to read
            bar.setValue(bar.maximum())

    def _clean(self, text: str) -> str:
        for s in self.secrets:
            if s:
                text = text.replace(s, "••••")
        return text

    def _show_in_source(self) -> None:
        if self._shown is None or self._shown[1] == 0:
            return
        rid, n = self._shown
        rnd = self.talks[rid].rounds[n]
        src = proposed_source(rnd.reply)
        if src is None:
            return
        v = rnd.verdict or {}
        model = (self.talks[rid].request or {}).get("model", "the model")
        note = (f"{model}'s proposal, round {n}: " + (verdict_line(v) if v else "not checked yet")
                + " (the region's own kernel comes back when it is selected again)")
        self.show_source.emit(f"{rid} · {model} · round {n}", self._clean(src), self._clean(note))

    # for tests and the screenshot tool -----------------------------------------------------------------
    def rounds(self, rid: str) -> list[int]:
        return sorted(self.talks[rid].rounds) if rid in self.talks else []

    def select(self, rid: str, n: int = 0) -> None:
        item = self._region_item(rid, create=False) if n == 0 else self._round_item(rid, n)
        self.follow = False
        self.tree.setCurrentItem(item)

    def all_text(self) -> str:
        """Everything the dock can show, every round rendered in turn (to check nothing is leaked)."""
        keep = self._shown
        parts = [self.notice.text()]
        it = self.tree.invisibleRootItem()
        stack = [it]
        while stack:
            node = stack.pop()
            for i in range(node.childCount()):
                c = node.child(i)
                parts += [c.text(0), c.text(1), c.toolTip(1)]
                stack.append(c)
        for rid, talk in self.talks.items():
            for n in [0, *sorted(talk.rounds)]:
                self._show((rid, n))
                parts += [self.verdict.text(), self.conversation.toPlainText(), self.diff.toPlainText()]
        self._show(keep)
        return "\n".join(parts)
