"""A chunked state-space scan (Mamba2's SSD, in the spelling of KernelBench level 3, 48/49) as a small
torch module with every tensor an input, so nothing folds into a constant: cumsum along the chunk,
the segment sum cumsum[..., :, None] - cumsum[..., None, :] masked to -inf above the diagonal by a
tril mask, exp, and einsums between.

Its outputs are ill-conditioned on purpose (A is standard normal, not negative as in a trained model):
exp of running sums of 64 normals reaches 1e10, the einsums add terms up to 1e15 that cancel to O(10),
and a one-ulp change in one running sum moves an output by many times atol = rtol = 1e-4. A kernel in
this program must give the reference's bits where the reference is exact, not just be close.

Shared by the CPU tests (emulated kernels) and the GPU tests; needs only torch."""
import torch
import torch.nn.functional as F


def segment_sum(x, lower=True, diagonal=0):
    """exp-ready segment sums of the last dim: s[i, j] = cumsum[i] - cumsum[j] where j <= i (the tril
    mask with `diagonal`), -inf elsewhere; lower=False masks with triu instead."""
    n = x.size(-1)
    c = torch.cumsum(x, dim=-1)
    s = c[..., :, None] - c[..., None, :]
    ones = torch.ones(n, n, dtype=torch.bool, device=x.device)
    keep = torch.tril(ones, diagonal=diagonal) if lower else torch.triu(ones, diagonal=diagonal)
    return s.masked_fill(~keep, -torch.inf)


class ChunkedScan(torch.nn.Module):
    """Y (final_state=False) or the state after the last chunk (True) of the chunked scan."""

    def __init__(self, chunk: int, final_state: bool = False):
        super().__init__()
        self.chunk, self.final_state = chunk, final_state

    def forward(self, X, A, B, C):
        b, T, h, p = X.shape
        ln = self.chunk
        c = T // ln
        Xb, Bb, Cb = X.reshape(b, c, ln, h, p), B.reshape(b, c, ln, h, -1), C.reshape(b, c, ln, h, -1)
        Ab = A.reshape(b, c, ln, h).permute(0, 3, 1, 2)
        acs = torch.cumsum(Ab, dim=-1)
        L = torch.exp(segment_sum(Ab))
        y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cb, Bb, L, Xb)
        decay = torch.exp(acs[:, :, :, -1:] - acs)
        states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bb, decay, Xb)
        states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
        decay_chunk = torch.exp(segment_sum(F.pad(acs[:, :, :, -1], (1, 0))))
        new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
        if self.final_state:
            return new_states[:, -1]
        y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cb, new_states[:, :-1], torch.exp(acs))
        return (y_diag + y_off).reshape(b, T, h, p)


def example_inputs(b, T, h, p, n, seed=0):
    """X uniform in [0, 1) and A, B, C standard normal, as KernelBench draws them."""
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(b, T, h, p, generator=g), torch.randn(b, T, h, generator=g),
            torch.randn(b, T, h, n, generator=g), torch.randn(b, T, h, n, generator=g)]
