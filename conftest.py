"""Test-wide set-up: Qt renders offscreen (CI has no screen), and the studio's settings and recovery
files go to a private folder per test process (HOME too), so tests neither read nor clobber a user's
(or a parallel worker's) files."""
import os
import tempfile

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("STITCHCUDA_CACHE", os.path.join(os.path.dirname(__file__), ".cache", "test"))
_private = tempfile.mkdtemp(prefix="stitchcuda-test-")
os.environ["XDG_DATA_HOME"] = os.path.join(_private, "data")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_private, "config")
os.environ["XDG_CACHE_HOME"] = os.path.join(_private, "cache")
# Qt's test mode (QStandardPaths.setTestModeEnabled) puts settings and recovery files under
# $HOME/.qttest whatever XDG says: a private HOME keeps two pytest-xdist workers out of each other's
os.environ["HOME"] = os.path.join(_private, "home")
os.makedirs(os.environ["HOME"], exist_ok=True)
