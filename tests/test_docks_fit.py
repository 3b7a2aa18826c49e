"""The docks sized and worded for their content, as a user sees them (pytest-qt, offscreen): a replayed
H200 run opened through File > Open results, then each dock read off the screen: the source view's
title and hint are whole, the Regions table's columns hold their cells, the decision log's long rows
wrap instead of ending in "...", the E2E bars' labels sit apart inside the plot, the results summary
fits its width and scrolls for the rest, and the status bar's counts agree with their nouns."""
from __future__ import annotations

import itertools
import os

import pytest
from PySide6.QtCore import QRect, QRectF, Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication, QFileDialog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200 = os.path.join(ROOT, "tests", "data", "mlp_small_h200")
CELL_MARGIN = 8   # the style's text margins inside a table cell


@pytest.fixture
def replayed(studio_window, monkeypatch, qtbot):
    """The studio after File > Open results on the recorded H200 run (the folder dialog answered)."""
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: H200)
    studio_window.agent.act["open_results"].trigger()
    qtbot.waitUntil(lambda: studio_window.agent.regions.tree.topLevelItemCount() == 3)
    for _ in range(5):
        QApplication.processEvents()
    return studio_window


def fits(widget, text: str) -> bool:
    return QFontMetrics(widget.font()).horizontalAdvance(text) <= widget.contentsRect().width()


def test_status_bar_counts_agree_with_their_nouns(replayed):
    text = replayed.status_label.text()
    assert "mlp_small: 3 regions, 49 events" in text, text
    assert replayed.count_label.text() == "5 nodes · 12 values"


def test_source_view_title_and_hint_are_whole(replayed, qtbot):
    src = replayed.agent.source
    assert src.title.text() == "No region selected" and src.title.shown_text() == src.title.text()
    assert fits(src.title, src.title.shown_text())
    # the hint is in the empty editor, wrapped to its width: every line of it inside the viewport
    hint = src.edit.placeholderText()
    assert hint.startswith("Click a region") and not src.edit.toPlainText()
    port = src.edit.viewport().rect()
    fm = QFontMetrics(src.edit.font())
    wrapped = fm.boundingRect(QRect(0, 0, port.width() - 10, 1 << 20), Qt.TextWordWrap, hint)
    assert wrapped.height() < port.height() and wrapped.width() <= port.width() - 10
    # a region's title longer than the dock is elided, never widening it; its tooltip holds all of it
    width = replayed.source_dock.width()
    tree = replayed.agent.regions.tree
    qtbot.mouseClick(tree.viewport(), Qt.LeftButton, pos=tree.visualItemRect(tree.topLevelItem(0)).center())
    assert replayed.agent.current == "r1" and "relu" in src.title.text()
    QApplication.processEvents()
    assert fits(src.title, src.title.shown_text())
    assert src.title.shown_text() == src.title.text() or src.title.toolTip() == src.title.text()
    assert abs(replayed.source_dock.width() - width) <= 2   # picking a region did not resize the dock
    src.scope.setCurrentIndex(1)   # Whole program: no hint, and the count agrees with its noun
    assert src.title.text() == "mlp_small: 3 regions" and not src.edit.placeholderText()


def test_regions_table_columns_hold_their_cells_and_headers(replayed):
    tree = replayed.agent.regions.tree
    fm = QFontMetrics(tree.font())
    head = tree.headerItem()
    total = sum(tree.columnWidth(c) for c in range(tree.columnCount()))
    assert total <= tree.viewport().width() + 1, "the table scrolls sideways at the default width"
    assert [head.text(tree.header().logicalIndex(v)) for v in range(tree.columnCount())] == [
        "Region", "Kind", "Status", "Speedup", "Measured", "Nodes"]   # the node count last: it gives way first
    for c in range(tree.columnCount()):
        if head.text(c) != "Nodes":   # its digits stay whole; its header may be cut where the dock is narrow
            assert fm.horizontalAdvance(head.text(c)) + CELL_MARGIN <= tree.columnWidth(c), head.text(c)
        for i in range(tree.topLevelItemCount()):
            text = tree.topLevelItem(i).text(c)
            assert fm.horizontalAdvance(text) + CELL_MARGIN <= tree.columnWidth(c), (head.text(c), text)
    speedups = [tree.topLevelItem(i).text(4) for i in range(3)]
    assert speedups == ["1.13x", "1.02x", "1.00x est."]


def test_decision_log_rows_wrap_to_show_all_their_text(replayed, qtbot):
    agent = replayed.agent
    agent.log_dock.raise_()
    tree = agent.log.tree
    for width in (None, 420):   # as laid out, then with the dock narrowed
        if width:
            replayed.resizeDocks([agent.log_dock], [width], Qt.Horizontal)
        qtbot.wait(20)
        col = tree.columnWidth(3)
        fm = QFontMetrics(tree.font())
        long_rows = 0
        for i in range(tree.topLevelItemCount()):
            it = tree.topLevelItem(i)
            text = it.text(3)
            need = fm.boundingRect(QRect(0, 0, col - CELL_MARGIN, 1 << 20), Qt.TextWordWrap, text).height()
            long_rows += need > fm.lineSpacing()
            assert tree.visualItemRect(it).height() >= need, (text, col)
        assert long_rows >= 3, "the recording has long reasons: some rows must take more than one line"


def test_e2e_labels_sit_apart_inside_the_plot_and_the_summary_scrolls(replayed):
    pv = replayed.agent.profiles
    labels = pv.e2e.visible_labels()
    assert len(labels) == 4
    box = pv.e2e.plotItem.getViewBox().sceneBoundingRect()
    rects = [t.mapRectToScene(t.boundingRect()) for t in labels]
    for a, b in itertools.combinations(rects, 2):
        assert not a.intersects(b), (a, b)
    assert all(box.contains(r) for r in rects)
    # the summary wraps to its width (never clipped at the side) and scrolls for what is below
    label = pv.summary.label
    scroll = label.parentWidget().parentWidget()
    assert label.width() <= scroll.viewport().width()
    assert label.height() >= label.heightForWidth(label.width())
    assert "3 regions" in pv.summary.plain_text() and "1 regions" not in pv.summary.plain_text()
    assert QRectF(pv.summary.rect()).contains(QRectF(scroll.geometry()))
