"""TMA tensor maps for the generated kernels' bulk copies (KernelSource.tensor_maps).

A CUtensorMap is 128 opaque bytes the driver encodes on the host (cuTensorMapEncodeTiled) from a matrix's
address, sizes and row stride and the box a copy moves. The kernel takes it by value as a
`__grid_constant__` parameter; CuPy passes a NumPy structured scalar of the same 128 bytes as one, so a
launch needs no device buffer and a CUDA graph captures the map with the launch.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..errors import StitchError

BY_VALUE = np.dtype({"names": [f"w{i}" for i in range(16)], "formats": ["<u8"] * 16}, align=True)
_FLOAT32, _SWIZZLE_128B, _L2_PROMOTE_128B = 7, 3, 2      # CUtensorMapDataType, CUtensorMapSwizzle, L2 promotion
_encode = None


class TensorMapError(StitchError):
    """A matrix a TMA copy cannot read (alignment, stride), or no driver to encode the map."""


def _driver():
    global _encode
    if _encode is None:
        try:
            f = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        except OSError as exc:
            raise TensorMapError(f"no CUDA driver to encode a TMA tensor map ({exc})") from None
        except AttributeError:
            raise TensorMapError("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a CUDA 12 driver); "
                                 "the tile GEMM's TMA loop cannot run here") from None
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int]
        _encode = f
    return _encode


def encode(ptr: int, m: dict) -> np.void:
    """The tensor map of the fp32 matrix at device address ptr described by m (KernelSource.tensor_maps:
    rows, cols, row_stride in elements, box_rows x box_cols per copy), 128-byte swizzled, zeros read past
    its edges, as a structured scalar to pass by value (read-only: the same one is handed out again)."""
    return _encoded(ptr, int(m["rows"]), int(m["cols"]), int(m["row_stride"]), int(m["box_rows"]),
                    int(m["box_cols"]))


@functools.lru_cache(maxsize=4096)
def _encoded(ptr: int, rows: int, cols: int, stride: int, box_rows: int, box_cols: int) -> np.void:
    """encode's map, once per address and shape: the program runtime launches a kernel again and again
    on the same buffers (its memory plan), so each launch would otherwise ask the driver anew."""
    if ptr % 16 or (rows > 1 and (stride * 4) % 16):
        raise TensorMapError(f"a TMA copy needs a 16-byte aligned matrix with 16-byte row strides: address "
                             f"{ptr:#x}, rows {stride * 4} bytes apart")
    out = (ctypes.c_ubyte * 128)()
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(-(-max(stride, cols) // 4) * 16)   # one row's: unread, still 16-byte
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    ones = (ctypes.c_uint32 * 2)(1, 1)
    rc = _driver()(out, _FLOAT32, 2, ctypes.c_void_p(ptr), dims, strides, box, ones, 0, _SWIZZLE_128B,
                   _L2_PROMOTE_128B, 0)
    if rc:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for a [{rows}, {cols}] fp32 matrix, "
                             f"rows {stride} apart, boxes of {box_rows} x {box_cols}")
    return np.frombuffer(bytes(out), dtype=BY_VALUE)[0]


def maps_for(kernel, inputs) -> tuple:
    """The kernel's tensor maps over these bound inputs (tensors or device addresses), in parameter order."""
    return tuple(encode(_address(inputs[m["input"]]), m) for m in kernel.tensor_maps)


def _address(t) -> int:
    return t if isinstance(t, int) else t.data_ptr()
