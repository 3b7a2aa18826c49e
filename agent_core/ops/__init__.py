"""The op library. Importing this package registers every op."""
from .registry import (  # noqa: F401
    CATEGORIES, DTYPES, DTYPE_BYTES, FLOAT_DTYPES, REQUIRED, REGISTRY, Attr, OpDef, TensorSpec,
    aliases_of, all_ops, get_op, register,
)
from . import (  # noqa: F401,E402  (importing registers)
    pointwise, reduction, normalization, matmul, convolution, pooling, layout, loss, recurrent, opaque,
)
