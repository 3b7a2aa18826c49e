"""Importers: modules and KernelBench files become programs that match the original module."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.errors import ImportFailure, StitchError
from agent_core.importers import import_file, import_module, import_nn_module, verify_import
from agent_core.ir import Role
from agent_core.reference import random_inputs, run_reference


def _import_and_verify(module, inputs, **kw):
    torch.manual_seed(0)
    program = import_nn_module(module, inputs, **kw)
    program.check()
    err = verify_import(program, module, draws=3)
    assert err < 1e-4
    return program


def _ops(program):
    return sorted(n.op for n in program.nodes.values())


class LinearGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return F.gelu(self.fc(x), approximate="tanh")


def test_linear_gelu_maps_to_library_ops_with_weights():
    m = LinearGelu()
    p = _import_and_verify(m, [torch.randn(4, 16)])
    assert _ops(p) == ["gelu", "linear"]
    gelu = next(n for n in p.nodes.values() if n.op == "gelu")
    assert gelu.attrs["approximate"] == "tanh"
    weight = p.value_by_name("fc.weight")
    assert weight.role == Role.PARAMETER
    assert torch.equal(torch.from_numpy(p.data[weight.id]), m.fc.weight.detach())
    assert not p.metadata["import_warnings"]


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, stride=2)
        self.bn = nn.BatchNorm2d(6)
        with torch.no_grad():  # non-trivial running statistics, so eval-mode BN really matters
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_conv_bn_relu_keeps_buffers_as_parameters():
    p = _import_and_verify(ConvBnRelu(), [torch.randn(2, 3, 10, 10)])
    assert _ops(p) == ["batch_norm", "conv2d", "relu"]
    conv = next(n for n in p.nodes.values() if n.op == "conv2d")
    assert conv.attrs["stride"] == [2, 2] and conv.attrs["padding"] == [1, 1]
    assert p.value_by_name("bn.running_var").role == Role.PARAMETER
    assert not any("num_batches_tracked" in v.name for v in p.values.values())


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(12)

    def forward(self, x):
        return torch.softmax(self.ln(x), dim=1), torch.log_softmax(x, -1)


def test_layer_norm_softmax_and_two_outputs():
    p = _import_and_verify(Norms(), [torch.randn(3, 5, 12)])
    assert _ops(p) == ["layer_norm", "log_softmax", "softmax"]
    assert len(p.outputs) == 2


class CrossEntropy(nn.Module):
    def forward(self, logits, target):
        return F.cross_entropy(logits, target)


def test_cross_entropy_gets_class_index_hints():
    logits, target = torch.randn(8, 5), torch.randint(0, 5, (8,))
    p = _import_and_verify(CrossEntropy(), [logits, target])
    assert _ops(p) == ["cross_entropy"]
    t = p.value_by_name("target")
    assert t.dtype == "int64" and t.init["kind"] == "randint"
    assert 0 <= t.init["low"] and t.init["high"] <= 5


class Scalars(nn.Module):
    def forward(self, x, y):
        z = (x * 2.5 + 1) / 3
        z = 1 - z
        z = torch.add(z, y, alpha=0.5)
        z.mul_(2)  # in place
        return z.pow(2), (y > 0).float() * z


def test_scalar_ops_alpha_in_place_and_implicit_casts():
    p = _import_and_verify(Scalars(), [torch.randn(4, 4), torch.randn(4, 4)])
    ops = _ops(p)
    for op in ("mul_scalar", "add_scalar", "div_scalar", "rsub_scalar", "square", "gt", "cast"):
        assert op in ops, (op, ops)
    assert "opaque" not in ops


class MaxWithIndices(nn.Module):
    def forward(self, x):
        values, idx = torch.max(x, dim=1)
        return values, idx, x.sum(dim=(0, 2), keepdim=True)


def test_multiple_outputs_including_indices():
    p = _import_and_verify(MaxWithIndices(), [torch.randn(2, 6, 3)])
    assert [p.values[v].dtype for v in p.outputs] == ["float32", "int64", "float32"]
    assert {"max", "argmax", "sum"} <= set(_ops(p))


class Upsample(nn.Module):
    def forward(self, x):      # by 1.5: not a whole factor, so not views (test_upsample_nearest.py)
        return torch.sigmoid(F.interpolate(x, scale_factor=1.5, mode="nearest"))


def test_unknown_op_becomes_opaque_with_a_warning_and_still_matches():
    p = _import_and_verify(Upsample(), [torch.randn(1, 2, 4, 4)])
    opaque = [n for n in p.nodes.values() if n.op == "opaque"]
    assert len(opaque) == 1 and opaque[0].attrs["target"].startswith("aten.upsample_nearest2d")
    assert any("upsample_nearest2d" in w for w in p.metadata["import_warnings"])
    assert p.metadata["opaque_ops"]


class ConstantInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.shift = torch.linspace(-1, 1, 4)  # a plain tensor attribute: a lifted constant

    def forward(self, x, scale):
        return (x + self.shift) * scale + torch.ones(4)


def test_lifted_constants_and_baked_scalar_inputs():
    torch.manual_seed(0)
    m = ConstantInForward()
    p = import_nn_module(m, [torch.randn(3, 4), 2.0])
    assert [p.values[v].name for v in p.inputs] == ["x"]
    roles = {v.role for v in p.values.values() if v.producer is None and v.id not in p.inputs}
    assert roles == {Role.CONSTANT}
    assert p.metadata["baked_inputs"] == {"scale": 2.0}
    assert verify_import(p, m, draws=3) < 1e-5


def test_verify_names_the_output_that_differs():
    m = Norms()
    p = import_nn_module(m, [torch.randn(3, 5, 12)])
    sm = next(n for n in p.nodes.values() if n.op == "softmax")
    p.set_attrs(sm.id, {"dim": 2})
    with pytest.raises(StitchError, match="output 'out0'"):
        verify_import(p, m, draws=1)


KB_FILE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features, classes):
        super().__init__()
        self.fc = nn.Linear(features, classes)

    def forward(self, x, target, p):
        return torch.nn.functional.cross_entropy(self.fc(x), target) + torch.log(p).mean()

batch, features, classes = 16, 10, 7

def get_inputs():
    return [torch.randn(batch, features), torch.randint(0, classes, (batch,)), torch.rand(batch, 32)]

def get_init_inputs():
    return [features, classes]
"""


def test_kernelbench_file_imports_with_hints_and_matches(tmp_path):
    f = tmp_path / "7_Gemm_CE.py"
    f.write_text(KB_FILE)
    p = import_file(f)
    assert p.name == "7_Gemm_CE"
    x, target, prob = (p.values[v] for v in p.inputs)
    assert x.init is None
    assert target.init == {"kind": "randint", "low": 0, "high": 7}
    assert prob.init == {"kind": "uniform", "low": 0.0, "high": 1.0}
    assert p.metadata["source"]["init_args"] == [10, 7]
    # the same file imported twice gives the same weights (seeded)
    q = import_file(f)
    w = p.value_by_name("fc.weight").id
    assert (p.data[w] == q.data[q.value_by_name("fc.weight").id]).all()
    from agent_core.importers import load_source
    mod = load_source(f)
    torch.manual_seed(0)
    assert verify_import(p, mod.Model(10, 7), draws=3) < 1e-4
    out = run_reference(p, random_inputs(p, seed=3))
    assert torch.isfinite(next(iter(out.values()))).all()


def test_a_module_passed_in_keeps_its_weights_apart_and_a_files_model_lends_them(tmp_path):
    import numpy as np
    m = LinearGelu()
    p = import_nn_module(m, [torch.randn(4, 16)])
    w = p.data[p.value_by_name("fc.weight").id]
    with torch.no_grad():
        m.fc.weight.add_(1.0)                        # the caller's module changes afterwards
    assert not np.allclose(w, m.fc.weight.detach().numpy())   # the program kept its own copy
    f = tmp_path / "7_Gemm_CE.py"
    f.write_text(KB_FILE)
    q = import_file(f)                               # its model is built for the import and dropped
    arr = q.data[q.value_by_name("fc.weight").id]
    assert not arr.flags.owndata and arr.base is not None     # the model's own memory, not a copy
    assert verify_import(q, _seeded_model(f), draws=2) < 1e-4


def _seeded_model(f):
    from agent_core.importers import load_source
    torch.manual_seed(0)
    return load_source(f).Model(10, 7)


def test_import_module_with_file_target_and_specs(tmp_path):
    f = tmp_path / "mymodel.py"
    f.write_text(textwrap.dedent("""
        import torch.nn as nn
        class Net(nn.Module):
            def __init__(self, n=8):
                super().__init__()
                self.fc = nn.Linear(n, 3)
            def forward(self, x):
                return self.fc(x).relu()
    """))
    p = import_module(f"{f}:Net", inputs=[((5, 8), "float32")], init_args=[8])
    assert [p.values[v].shape for v in p.inputs] == [(5, 8)]
    assert _ops(p) == ["linear", "relu"]
    p2 = import_module("torch.nn:GELU", inputs=[((2, 3), "float32")])
    assert _ops(p2) == ["gelu"]


@pytest.mark.parametrize("text, message", [
    ("import torch\ndef get_inputs():\n    return []\n", "defines no Model class"),
    ("import torch\nclass Model(torch.nn.Module:\n    pass\n", "syntax error at line 2"),
    ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
     "def get_inputs():\n    raise ValueError('no data here')\n", "get_inputs\\(\\) raised ValueError: no data here"),
    ("import torch\nclass Model(torch.nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
     "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n", "Model\\(\\*init_args\\) raised TypeError"),
])
def test_broken_files_give_one_line_import_failures(tmp_path, text, message):
    f = tmp_path / "broken.py"
    f.write_text(text)
    with pytest.raises(ImportFailure, match=message) as info:
        import_file(f)
    assert "\n" not in str(info.value)


def test_bad_module_targets():
    with pytest.raises(ImportFailure, match="module:Class"):
        import_module("torch.nn.ReLU")
    with pytest.raises(ImportFailure, match="cannot import module 'no_such_pkg_xyz'"):
        import_module("no_such_pkg_xyz:Model")
    with pytest.raises(ImportFailure, match="give inputs"):
        import_module("torch.nn:ReLU")


def test_make_fx_fallback_when_export_refuses(monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("export refused this module")

    monkeypatch.setattr(torch.export, "export", refuse)
    m = ConvBnRelu()
    p = import_nn_module(m, [torch.randn(2, 3, 8, 8)])
    assert p.metadata["import_method"] == "make_fx"
    assert "make_fx" in p.metadata["import_warnings"][0]
    assert _ops(p) == ["batch_norm", "conv2d", "relu"]
    assert verify_import(p, m, draws=2) < 1e-4


def test_large_inputs_are_traced_on_fake_tensors_with_probed_hints(tmp_path, monkeypatch):
    from agent_core.importers import source
    monkeypatch.setattr(source, "INPUT_ELEMENT_LIMIT", 1000)
    f = tmp_path / "big.py"
    f.write_text(KB_FILE.replace("batch, features, classes = 16, 10, 7", "batch, features, classes = 200, 10, 7"))
    p = import_file(f)
    x, target, prob = (p.values[v] for v in p.inputs)
    assert (x.shape, target.shape, prob.shape) == ((200, 10), (200,), (200, 32))  # nothing shrunk
    assert target.init == {"kind": "randint", "low": 0, "high": 7}  # exact, from the randint call
    assert prob.init == {"kind": "uniform", "low": 0.0, "high": 1.0}
    assert p.value_by_name("fc.weight").id in p.data
    q = import_file(f, weights=False)  # meta model: shapes without data
    assert q.value_by_name("fc.weight").id not in q.data


class NoiseInForward(nn.Module):
    def forward(self, x):
        return x + torch.randn(4)


def test_random_tensor_in_forward_is_baked_as_a_constant_with_a_warning():
    torch.manual_seed(0)
    p = import_nn_module(NoiseInForward(), [torch.randn(2, 4)])
    consts = [v for v in p.values.values() if v.role == Role.CONSTANT]
    assert len(consts) == 1 and consts[0].shape == (4,) and consts[0].id in p.data
    assert any("random tensor" in w for w in p.metadata["import_warnings"])
    assert _ops(p) == ["add"]


class Assorted(nn.Module):
    """Layout, reduction and arithmetic forms that KernelBench rarely uses."""

    def forward(self, x, y):
        a, b = torch.chunk(x, 2, dim=1)
        s = torch.stack([a, b], dim=-1).flatten(2)
        u = torch.unbind(y, dim=1)[1]
        w = torch.where(x > 0, x, 0.0)
        v = x.var(dim=1, keepdim=True) + x.std(dim=-1, unbiased=False).unsqueeze(-1)
        p = x.abs().prod(dim=1, keepdim=True)
        m = x.amax(dim=(1, 2)) - x.amin(dim=1).sum(-1)
        c = torch.cumsum(x, dim=2, dtype=torch.float64).float()
        d = torch.div(x, 3, rounding_mode="floor") + 2 ** x + x ** 3 + 1 / (x.abs() + 1)
        t = x.transpose(1, 2).contiguous().view(x.shape[0], -1)
        e = y[:, 1:3].expand(4, 2, 2, 3)
        f = F.normalize(x, dim=1) + F.dropout(x, 0.3, training=False)
        return s, u, w, v, p, m, c, d, t, e, f, x.max(), torch.cat([x, x], 0).mean(), x.split([1, 3], dim=1)[1]


def test_assorted_ops_map_without_opaque_nodes():
    p = _import_and_verify(Assorted(), [torch.randn(4, 4, 3), torch.randn(1, 4, 2, 3)])
    assert p.metadata["import_warnings"] == []
    assert len(p.outputs) == 14


def test_real_modules_import_and_match():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    p = _import_and_verify(layer, [torch.randn(2, 5, 16)])
    assert {"linear", "layer_norm"} <= set(_ops(p))
    assert "opaque" not in _ops(p)
    emb = _import_and_verify(nn.Embedding(10, 4), [torch.randint(0, 10, (3, 5))])
    assert _ops(emb) == ["embedding"]
    assert emb.value_by_name("input").init == {"kind": "randint", "low": 0, "high": 10}
    lstm = _import_and_verify(nn.LSTM(4, 6, batch_first=True), [torch.randn(2, 3, 4)])
    assert _ops(lstm) == ["lstm"] and not lstm.metadata["opaque_ops"]   # a library node (ops/recurrent.py)


def test_complex_intermediates_run_as_opaque_nodes(tmp_path):
    """torch.fft makes complex values: they flow between opaque nodes and the import still matches."""
    src = tmp_path / "fft_model.py"
    src.write_text(
        "import torch, torch.nn as nn\n"
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.view_as_real(torch.fft.rfft(x)).sum(-1)\n"
        "def get_inputs():\n    return [torch.randn(4, 16)]\n"
        "def get_init_inputs():\n    return []\n")
    from agent_core.importers import import_file
    from agent_core.reference import random_inputs, run_reference
    p = import_file(str(src))
    assert not [d for d in p.validate() if d.severity == "error"]
    assert any("fft_rfft" in w for w in p.metadata["import_warnings"])
    x = random_inputs(p)["x"]
    expected = torch.view_as_real(torch.fft.rfft(x)).sum(-1)
    assert torch.allclose(run_reference(p, [x])["sum"], expected, atol=1e-5)


class IgnoredMean(nn.Module):
    def forward(self, loss, labels):
        m = (labels != -100).float()
        return (loss * m).sum() / m.sum().clamp(min=1) + (loss != loss).float().sum()


def test_not_equal_imports_as_ne_not_an_opaque_node():
    labels = torch.randint(0, 5, (4, 6))
    labels[0, :3] = -100
    p = _import_and_verify(IgnoredMean(), [torch.randn(4, 6), labels])
    assert _ops(p).count("ne") == 2 and "opaque" not in _ops(p)
