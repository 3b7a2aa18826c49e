"""Test-wide set-up: Qt renders offscreen (CI has no screen), test outputs go to test-output/."""
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("STITCHCUDA_CACHE", os.path.join(os.path.dirname(__file__), ".cache", "test"))
