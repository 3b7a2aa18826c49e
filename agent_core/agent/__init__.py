"""The agent loop and its event stream."""
from .events import EVENTS, SCHEMA, VERSION, BadLine, EventEmitter, EventError, parse_event, read_events  # noqa: F401
from .loop import NO_GPU_LINE, OptimizeResult, RegionOutcome, kernel_name, optimize  # noqa: F401
