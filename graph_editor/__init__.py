"""The node canvas over an agent_core Program: scene, view, items, palette, inspector, undo commands, layout."""
