"""Running generated kernels: load and launch on torch tensors (launch), regions with fallback (region).

Imports of CuPy happen on first use, so this package imports on machines without a GPU.
"""
from .region import RegionRunner, build_region  # noqa: F401
