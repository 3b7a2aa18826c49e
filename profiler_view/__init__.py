"""pyqtgraph widgets fed by agent events and profile results: kernel bars, end to end, timeline,
roofline and live tuning (ProfilePanel holds them all). Never imports graph_editor."""
