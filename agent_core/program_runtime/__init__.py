"""The end-to-end program: a step list on one stream, in one CUDA graph, its intermediates allocated by
the steps that write them and released after their last readers (memory_plan predicts the peak)."""
from .memory_plan import MemoryPlan, eager_peak_estimate, plan_memory  # noqa: F401
from .steps import Step, plan_steps  # noqa: F401


def build_executable(program, fused, *, graph: bool = True, device: str = "cuda"):
    """See executable.ProgramExecutable (imported on use: it needs torch CUDA and CuPy)."""
    from .executable import ProgramExecutable
    return ProgramExecutable(program, fused, graph=graph, device=device)
