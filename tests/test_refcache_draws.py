"""The reference cache keeps the first draws it computed when a verification asks for more draws
than it has room for (issue 17: dropping the oldest made every access a miss, so each of
DenseNet201's regions ran the whole model five times on the H200)."""
import numpy as np
import torch

from agent_core.agent.refcache import ReferenceCache
from agent_core.ir import Program


def _chain() -> Program:
    rng = np.random.default_rng(0)
    p = Program("chain")
    h = p.add_input("x", (8, 16)).id
    w = p.add_parameter("w", rng.standard_normal((16, 16)).astype(np.float32)).id
    h = p.add_node("linear", [h, w]).outputs[0]
    p.mark_output(p.add_node("tanh", [h]).outputs[0])
    return p


def test_reference_draws_beyond_the_budget_do_not_evict_the_first_ones(monkeypatch):
    """5 draws, room for 3: the first two stay, the third slot rotates, so a second verification
    recomputes 3 draws, not 5 (dropping the oldest made every access a miss)."""
    import agent_core.agent.refcache as refcache
    p = _chain()
    runs = []
    real = refcache.run_reference
    monkeypatch.setattr(refcache, "run_reference", lambda *a, **k: runs.append(1) or real(*a, **k))
    per = sum(v.nbytes for v in p.values.values())
    monkeypatch.setattr(ReferenceCache, "MAX_CACHED_BYTES", 3 * per)
    ref = ReferenceCache(p, set(p.values), device="cpu")
    assert ref.max_draws == 3
    first = [ref.outputs(d)[0].clone() for d in range(5)]
    assert len(runs) == 5
    again = [ref.outputs(d)[0] for d in range(5)]
    assert len(runs) == 5 + 3 and list(ref._draws)[:2] == [0, 1]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
