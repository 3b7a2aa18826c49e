"""The end-to-end program: a step list over one memory arena, on one stream, in one CUDA graph."""
from .arena import ArenaPlan, Slot, check_arena, plan_arena  # noqa: F401
from .steps import Step, plan_steps  # noqa: F401


def build_executable(program, fused, *, graph: bool = True, device: str = "cuda"):
    """See executable.ProgramExecutable (imported on use: it needs torch CUDA and CuPy)."""
    from .executable import ProgramExecutable
    return ProgramExecutable(program, fused, graph=graph, device=device)
