"""Hulls of a run in progress: the worker's proposed regions drawn over the document's nodes as its
events arrive, their labels following the agent's verdicts (fused with its measured speedup, or fell
back). They are never stored in the document: a finished run's regions replace them as one undoable
edit, and a cancelled or crashed run leaves nothing behind.
"""
from __future__ import annotations

from agent_core.regions import KINDS, Region

from .region_item import RegionItem, RegionOverlay


class LiveRegionItem(RegionItem):
    @property
    def region(self):
        return self.overlay.live.get(self.region_id)

    def mousePressEvent(self, ev):   # not a document region yet: nothing to select
        ev.ignore()


class LiveRegionOverlay(RegionOverlay):
    def __init__(self, scene, parent=None):
        self.live: dict[str, Region] = {}
        super().__init__(scene, parent)

    def region_map(self) -> dict:
        return self.live

    def _on_event(self, event: str, payload: dict) -> None:
        if event in ("node_removed", "node_added", "node_moved", "node_changed"):
            self.update_geometry()

    def rebuild(self) -> None:
        self.drop_items(self.live)
        for rid in self.live:
            if rid not in self.items:
                item = LiveRegionItem(self, rid)
                self.items[rid] = item
                self.scene.add_overlay(item)
        self.update_geometry()

    def apply(self, e: dict) -> None:
        """One worker event: a proposal adds a hull (a part of a region that lost replaces its hull);
        verdicts and measurements relabel it."""
        kind, rid = e.get("event"), e.get("region")
        if kind == "region-proposed" and e.get("kind") in KINDS:
            nodes = [n for n in e.get("nodes") or [] if n in self.scene.nodes]
            if not nodes:            # the worker rewrote the program: its nodes are not on this canvas
                return
            self.live.pop(e.get("split_from"), None)     # a region that lost, tried as its parts
            self.live[rid] = Region(rid, e["kind"], nodes, reason=e.get("reason") or "",
                                    est_before_ms=e.get("est_before_ms"), est_after_ms=e.get("est_after_ms"),
                                    schedule=dict(e.get("schedule") or {}))
            self.rebuild()
            return
        r = self.live.get(rid)
        if r is None:
            return
        agent = r.schedule.setdefault("agent", {})
        if kind == "fallback":
            agent.update(status="fallback", reason=e.get("reason") or "")
        elif kind == "log" and e.get("status"):
            agent.update(status=e["status"], reason=e.get("message") or "")
        elif kind == "tune-step" and e.get("best") and e.get("ms"):
            r.measured_ms = e["ms"]
        elif kind == "profile" and e.get("scope") == "region":
            r.measured_ms = e.get("fused_ms") or e.get("ms") or r.measured_ms
            if e.get("unfused_ms"):
                agent["unfused_ms"] = e["unfused_ms"]
        else:
            return
        item = self.items.get(rid)
        if item is not None:
            item.update()
