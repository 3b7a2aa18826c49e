"""Test-wide set-up: Qt renders offscreen (CI has no screen), and the studio's settings and recovery
files go to a private folder per test run, so tests neither read nor clobber a user's (or a parallel
run's) files."""
import os
import tempfile

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("STITCHCUDA_CACHE", os.path.join(os.path.dirname(__file__), ".cache", "test"))
_private = tempfile.mkdtemp(prefix="stitchcuda-test-")
os.environ["XDG_DATA_HOME"] = os.path.join(_private, "data")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_private, "config")
os.environ["XDG_CACHE_HOME"] = os.path.join(_private, "cache")
