"""The studio application: main window, docks, menus, settings, entry point."""
