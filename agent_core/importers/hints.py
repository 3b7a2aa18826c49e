"""Input init hints: how to draw random data that the model accepts, from the example inputs.

The reference and every verification run on random draws, so an input's distribution matters:
class targets must lie in [0, classes), a log or sqrt wants positive data, KL divergence wants rows
of probabilities. We look at the values get_inputs() produced (agent_core.reference.draw reads the
hint). Inputs too large to create on this machine are probed with every dimension capped (see
probe_inputs), which keeps the distribution while shrinking the tensor.
"""
from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

_PROBE_DIM = 32


def init_hint(t: torch.Tensor) -> dict | None:
    """The init hint for one example tensor; None means the default (standard normal)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta" or t.dtype == torch.bool:
        return None
    if not t.is_floating_point():
        return {"kind": "randint", "low": int(t.min()), "high": int(t.max()) + 1}
    x = t.detach().double()
    if not torch.isfinite(x).all():
        return None
    lo, hi = float(x.min()), float(x.max())
    if lo >= 0 and x.dim() >= 1 and x.shape[-1] > 1 and torch.allclose(x.sum(-1), torch.ones((), dtype=x.dtype),
                                                                         atol=1e-3):
        return {"kind": "softmax"}
    # a uniform sample's std is range/sqrt(12) ~ 0.29 range; a normal sample's range is 5+ stds
    if x.numel() >= 100 and hi > lo and float(x.std()) / (hi - lo) > 0.25:
        return {"kind": "uniform", "low": math.floor(lo * 10) / 10, "high": math.ceil(hi * 10) / 10}
    if lo >= 0:
        return {"kind": "positive"}
    return None


_SIZED = {torch.rand, torch.randn, torch.zeros, torch.ones, torch.empty}


def _cap(size):
    return tuple(min(int(d), _PROBE_DIM) for d in size)


def _randint_bounds(args, kwargs) -> tuple[int, int]:
    low = kwargs.get("low", 0)
    high = kwargs.get("high")
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    if high is None:
        low, high = (ints[0], ints[1]) if len(ints) >= 2 else (low, ints[0])
    return int(low), int(high)


class _Factories(TorchFunctionMode):
    """Records the exact hint of tensors that come straight from torch.rand / torch.randint (a
    sample may miss the extremes: 32 draws of randint(0, 4096) never reach 0), and with
    shrink=True creates every factory tensor with its dimensions capped at _PROBE_DIM."""

    def __init__(self, shrink: bool):
        super().__init__()
        self.shrink = shrink
        self.made: dict[int, tuple[torch.Tensor, dict | None]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        hint = "none"
        if func is torch.rand:
            hint = {"kind": "uniform", "low": 0.0, "high": 1.0}
        elif func is torch.randn:
            hint = None
        elif func is torch.randint:
            low, high = _randint_bounds(args, kwargs)
            hint = {"kind": "randint", "low": low, "high": high}
        if self.shrink:
            if func in _SIZED:
                size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
                args = (_cap(size),)
            elif func is torch.full:
                args = (_cap(args[0]),) + tuple(args[1:])
            elif func is torch.randint:
                if "size" in kwargs:
                    kwargs["size"] = _cap(kwargs["size"])
                else:
                    args = tuple(args[:-1]) + (_cap(args[-1]),)
        out = func(*args, **kwargs)
        if hint != "none" and isinstance(out, torch.Tensor):
            self.made[id(out)] = (out, hint)  # the tensor is kept so that its id stays unique
        return out

    def hint(self, t) -> dict | None:
        made = self.made.get(id(t))
        if made is not None and made[0] is t:
            return made[1]
        return init_hint(t)


def observed_inputs(get_inputs, seed: int, *, shrink: bool = False) -> tuple[list, list]:
    """(get_inputs() values, their hints). shrink=True caps every dimension (hints only)."""
    torch.manual_seed(seed)
    mode = _Factories(shrink)
    with mode:
        values = get_inputs()
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    return values, [mode.hint(v) for v in values]


def probe_hints(get_inputs, seed: int, n: int) -> list:
    """Hints from get_inputs() run with every dimension capped; defaults if it does not run so."""
    try:
        values, hints = observed_inputs(get_inputs, seed, shrink=True)
    except Exception:  # a shape-dependent get_inputs: fall back to default hints
        return [None] * n
    return hints if len(hints) == n else [None] * n
