"""The op library: every op's shape inference agrees with its torch reference, attributes normalize,
wrong arity and bad shapes give clear errors; targeted checks for the tricky shape rules."""
from __future__ import annotations

import itertools
import json
import warnings

import pytest
import torch
import torch.nn.functional as F

from agent_core.errors import ProgramError, ShapeError
from agent_core.ir import Program
from agent_core.ops import CATEGORIES, REQUIRED, TensorSpec, all_ops, get_op
from agent_core.ops.catalog import main as catalog_main, markdown
from agent_core.ops.common import dtype_name
from agent_core.reference import draw, run_reference

ALL = all_ops()
IDS = [op.name for op in ALL]


def _entry(e):
    """An example input: a shape, or (shape, dtype), or (shape, dtype, init)."""
    if isinstance(e, tuple) and e and isinstance(e[0], tuple):
        return TensorSpec(e[0], e[1]), (e[2] if len(e) > 2 else None)
    return TensorSpec(e), None


def example(op):
    """The op's declared example, or a synthesized one for pointwise ops: (3, 5) floats; further
    inputs broadcast as (5,); required attributes get 2."""
    if "example" in op.extra:
        shapes, attrs = op.extra["example"]
        return [_entry(e) for e in shapes], dict(attrs)
    assert op.category == "pointwise", f"{op.name} declares no example"
    n = op.arity()[0]
    specs = [(TensorSpec((3, 5)), None)] + [(TensorSpec((5,)), None)] * (n - 1)
    return specs, {a.name: 2 for a in op.attrs if a.default is REQUIRED}


def _draw(entries, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [draw(s.shape, s.dtype, init, gen) for s, init in entries]


def _results(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


@pytest.mark.parametrize("op", ALL, ids=IDS)
def test_inferred_specs_match_reference(op):
    entries, attrs = example(op)
    attrs = op.normalize_attrs(attrs)
    specs = op.infer([s for s, _ in entries], attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = _results(op.reference(_draw(entries), attrs))
    assert [(tuple(t.shape), dtype_name(t.dtype)) for t in out] == [(s.shape, s.dtype) for s in specs]
    flops = op.count_flops([s for s, _ in entries], specs, attrs)
    assert isinstance(flops, int) and flops >= 0


@pytest.mark.parametrize("op", ALL, ids=IDS)
def test_example_runs_as_a_program(op):
    """The same example built through the program model: inference, validation, the reference run."""
    entries, attrs = example(op)
    p = Program(op.name)
    ins = [p.add_input(f"in{i}", s.shape, s.dtype, init=init).id for i, (s, init) in enumerate(entries)]
    node = p.add_node(op.name, ins, attrs)
    for vid in node.outputs:
        p.mark_output(vid)
    assert [d for d in p.validate() if d.severity == "error"] == []
    gen = torch.Generator().manual_seed(3)
    inputs = {p.values[v].name: draw(s.shape, s.dtype, init, gen) for v, (s, init) in zip(ins, entries)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_reference(p, inputs)
    for vid in node.outputs:
        v = p.values[vid]
        assert tuple(out[v.name].shape) == v.shape and dtype_name(out[v.name].dtype) == v.dtype


@pytest.mark.parametrize("op", ALL, ids=IDS)
def test_attrs_normalize_and_survive_json(op):
    _, attrs = example(op)
    norm = op.normalize_attrs(attrs)
    assert set(norm) == {a.name for a in op.attrs}
    assert op.normalize_attrs(norm) == norm
    assert op.normalize_attrs(json.loads(json.dumps(norm))) == norm  # what the project file stores
    with pytest.raises(ProgramError, match=f"{op.name} has no attribute bogus"):
        op.normalize_attrs({**attrs, "bogus": 1})


@pytest.mark.parametrize("op", ALL, ids=IDS)
def test_wrong_arity_is_refused_with_the_ports_named(op):
    lo, hi = op.arity()
    counts = ([lo - 1] if lo > 0 else []) + ([hi + 1] if hi is not None else [])
    assert counts or op.name == "opaque"
    for n in counts:
        with pytest.raises(ProgramError, match=rf"^{op.name} takes .* inputs \(.*\), got {n}$"):
            op.check_arity(n)


# ops whose reference fails on perturbed inputs for data reasons (indices out of range) or by design
# (opaque declares its output instead of inferring it)
_DATA_DEPENDENT = {"embedding", "gather", "index_select", "nll_loss", "cross_entropy", "opaque"}


def _perturbed(entries):
    """Each input in turn made a scalar, given a trailing 1, losing its last dim, one longer in dim 0,
    and cast to int64, bool and float64."""
    for k, (spec, init) in enumerate(entries):
        s = spec.shape
        shapes = {(), s + (1,), s[:-1], ((s[0] + 1,) + s[1:]) if s else ()}
        variants = [TensorSpec(v, spec.dtype) for v in shapes if v != s]
        variants += [TensorSpec(s, d) for d in ("int64", "bool", "float64") if d != spec.dtype]
        for v in variants:
            yield [(v, init) if i == k else e for i, e in enumerate(entries)]


@pytest.mark.parametrize("op", ALL, ids=IDS)
def test_inference_is_sound_on_perturbed_inputs(op):
    """Whatever inference accepts, torch computes with exactly the inferred shapes and dtypes, and
    inference fails only with a ProgramError (never an IndexError or TypeError)."""
    entries, attrs = example(op)
    attrs = op.normalize_attrs(attrs)
    for case in _perturbed(entries):
        try:
            specs = op.infer([s for s, _ in case], attrs)
        except ProgramError:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = _results(op.reference(_draw(case), attrs))
            except (RuntimeError, IndexError, ValueError, ProgramError) as e:
                if op.name in _DATA_DEPENDENT:
                    continue
                pytest.fail(f"inference accepted {[str(s) for s, _ in case]} but torch refuses: {e}")
        assert [(tuple(t.shape), dtype_name(t.dtype)) for t in out] == [(s.shape, s.dtype) for s in specs], \
            [str(s) for s, _ in case]


@pytest.mark.parametrize("op", [o for o in ALL if o.category != "pointwise"],
                         ids=[o.name for o in ALL if o.category != "pointwise"])
def test_bad_shape_gives_a_message_naming_the_op(op):
    assert "bad" in op.extra, f"{op.name} declares no bad example"
    if op.extra["bad"] is None:  # any input shape is valid (contiguous)
        return
    shapes, attrs, fragment = op.extra["bad"]
    with pytest.raises(ShapeError) as err:
        op.infer([_entry(e)[0] for e in shapes], op.normalize_attrs(attrs))
    msg = str(err.value)
    assert fragment in msg and op.name in msg and "\n" not in msg


def test_every_op_has_a_category_and_pointwise_ops_a_cuda_expression():
    for op in ALL:
        assert op.category in CATEGORIES
        if op.category == "pointwise":
            assert op.cuda, op.name


def test_pointwise_binary_bad_shape_through_the_program():
    p = Program()
    a, b = p.add_input("a", (3, 5)), p.add_input("b", (4,))
    with pytest.raises(ShapeError, match=r"add.*shapes \[3, 5\] and \[4\] do not broadcast"):
        p.add_node("add", [a.id, b.id])


def test_arity_error_through_the_program_names_the_node():
    p = Program()
    x = p.add_input("x", (2, 3))
    with pytest.raises(ProgramError, match=r"linear takes 2 to 3 inputs \(x, weight, bias\?\), got 1"):
        p.add_node("linear", [x.id])


# --- matmul ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("a,b,want", [
    ((3,), (3,), ()), ((3,), (3, 4), (4,)), ((2, 3), (3,), (2,)), ((3,), (2, 3, 4), (2, 4)),
    ((2, 5, 3), (3,), (2, 5)), ((5, 1, 2, 3), (4, 3, 2), (5, 4, 2, 2)), ((2, 3), (3, 4), (2, 4)),
    ((1, 2, 3), (6, 3, 4), (6, 2, 4)),
])
def test_matmul_shapes_follow_torch(a, b, want):
    op = get_op("matmul")
    (spec,) = op.infer([TensorSpec(a), TensorSpec(b)], {})
    assert spec.shape == want == tuple(torch.matmul(torch.ones(a), torch.ones(b)).shape)


def test_matmul_errors_and_flops():
    op = get_op("matmul")
    with pytest.raises(ShapeError, match=r"a \[2, 3\] has 3 columns but b \[2, 3\] has 2 rows"):
        op.infer([TensorSpec((2, 3)), TensorSpec((2, 3))], {})
    with pytest.raises(ShapeError, match=r"batch dimensions \[2\] and \[3\] do not broadcast"):
        op.infer([TensorSpec((2, 4, 5)), TensorSpec((3, 5, 6))], {})
    with pytest.raises(ShapeError, match="float32.*float64"):
        op.infer([TensorSpec((2, 3)), TensorSpec((3, 4), "float64")], {})
    ins = [TensorSpec((8, 64, 32)), TensorSpec((32, 16))]
    assert op.count_flops(ins, op.infer(ins, {}), {}) == 2 * 8 * 64 * 16 * 32
    assert get_op("mm") is op


def test_linear_message_and_flops():
    op = get_op("linear")
    with pytest.raises(ShapeError) as err:
        op.infer([TensorSpec((4, 128)), TensorSpec((512, 256))], {})
    assert str(err.value) == "linear: x has 128 features but weight expects 256 (weight [512, 256])"
    with pytest.raises(ShapeError, match=r"bias \[7\] does not match 5 out_features"):
        op.infer([TensorSpec((4, 8)), TensorSpec((5, 8)), TensorSpec((7,))], {})
    ins = [TensorSpec((4, 8)), TensorSpec((5, 8))]
    assert op.count_flops(ins, op.infer(ins, {}), {}) == 2 * 4 * 5 * 8


def test_attention_with_mask_and_scale_matches_torch():
    op = get_op("scaled_dot_product_attention")
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 3)
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True
    attrs = op.normalize_attrs({"scale": 0.5})
    out = op.reference([q, k, v, mask], attrs)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5))
    assert op.infer([TensorSpec(q.shape), TensorSpec(k.shape), TensorSpec(v.shape), TensorSpec((4, 6), "bool")],
                    attrs)[0].shape == (2, 4, 3)
    with pytest.raises(ShapeError, match=r"attn_mask \[5, 6\] does not broadcast"):
        op.infer([TensorSpec(q.shape), TensorSpec(k.shape), TensorSpec(v.shape), TensorSpec((5, 6))], attrs)


# --- convolution ----------------------------------------------------------------------------------
def test_conv_transpose_output_sizes_match_torch():
    op = get_op("conv_transpose2d")
    x, w = torch.randn(1, 2, 4, 5), torch.randn(2, 3, 3, 2)
    for stride, padding, dilation in itertools.product((1, 2, 3), (0, 1, 2), (1, 2)):
        for outpad in range(max(stride, dilation)):
            attrs = op.normalize_attrs({"stride": [stride, 1], "padding": [padding, 0], "dilation": dilation,
                                        "output_padding": [outpad, 0]})
            try:
                want = tuple(op.reference([x, w], attrs).shape)
            except RuntimeError:
                with pytest.raises(ShapeError):
                    op.infer([TensorSpec(x.shape), TensorSpec(w.shape)], attrs)
                continue
            assert op.infer([TensorSpec(x.shape), TensorSpec(w.shape)], attrs)[0].shape == want, attrs
    with pytest.raises(ShapeError, match="output_padding .* must be smaller than stride"):
        op.infer([TensorSpec(x.shape), TensorSpec(w.shape)], op.normalize_attrs({"stride": 2, "output_padding": 2}))


def test_conv_padding_modes_groups_and_flops():
    op = get_op("conv2d")
    x, w = TensorSpec((2, 4, 9, 8)), TensorSpec((6, 2, 3, 1))
    attrs = op.normalize_attrs({"padding": "same", "dilation": [2, 1], "groups": 2})
    (out,) = op.infer([x, w], attrs)
    assert out.shape == (2, 6, 9, 8)
    assert out.shape == tuple(op.reference([torch.randn(x.shape), torch.randn(w.shape)], attrs).shape)
    assert op.infer([x, w], op.normalize_attrs({"padding": "valid", "groups": 2}))[0].shape == (2, 6, 7, 8)
    with pytest.raises(ShapeError, match="padding='same' needs stride 1"):
        op.infer([x, w], op.normalize_attrs({"padding": "same", "stride": 2, "groups": 2}))
    with pytest.raises(ProgramError, match=r"must be a list of integers or one of \['same', 'valid'\]"):
        op.normalize_attrs({"padding": "full"})
    with pytest.raises(ShapeError, match="larger than the padded input"):
        op.infer([TensorSpec((1, 4, 2, 2)), TensorSpec((6, 4, 3, 3))], op.normalize_attrs({}))
    ins = [x, w]
    outs = op.infer(ins, op.normalize_attrs({"groups": 2}))
    n, cout, ho, wo = outs[0].shape
    assert op.count_flops(ins, outs, {}) == 2 * n * cout * ho * wo * (4 // 2) * 3 * 1


# --- pooling --------------------------------------------------------------------------------------
def test_max_pool_ceil_mode_sizes_match_torch():
    op = get_op("max_pool1d")
    for size, k, s, dil, ceil in itertools.product(range(4, 10), (2, 3), (1, 2, 3), (1, 2), (False, True)):
        for p in range(k // 2 + 1):
            attrs = op.normalize_attrs({"kernel_size": k, "stride": s, "padding": p, "dilation": dil,
                                        "ceil_mode": ceil})
            x = torch.randn(1, 1, size)
            try:
                want = tuple(op.reference([x], attrs).shape)
            except RuntimeError:
                with pytest.raises(ShapeError):
                    op.infer([TensorSpec(x.shape)], attrs)
                continue
            assert op.infer([TensorSpec(x.shape)], attrs)[0].shape == want, (size, attrs)
    # the last window would start in the right padding, so ceil_mode drops it
    attrs = op.normalize_attrs({"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True})
    assert op.infer([TensorSpec((1, 1, 5))], attrs)[0].shape == (1, 1, 3)


def test_avg_pool_options_match_torch():
    op = get_op("avg_pool2d")
    x = torch.randn(1, 2, 7, 6)
    attrs = op.normalize_attrs({"kernel_size": [3, 2], "stride": [2, 2], "padding": [1, 1], "ceil_mode": True,
                                "count_include_pad": False, "divisor_override": 5})
    out = op.reference([x], attrs)
    assert out.shape == op.infer([TensorSpec(x.shape)], attrs)[0].shape
    assert torch.allclose(out, F.avg_pool2d(x, (3, 2), 2, 1, True, False, 5))
    with pytest.raises(ShapeError, match="floating-point"):
        op.infer([TensorSpec((1, 2, 4, 4), "int64")], op.normalize_attrs({"kernel_size": 2}))


def test_adaptive_pool_unbatched_and_global():
    op = get_op("adaptive_avg_pool2d")
    assert op.infer([TensorSpec((3, 7, 5))], op.normalize_attrs({"output_size": 1}))[0].shape == (3, 1, 1)
    assert op.infer([TensorSpec((2, 3, 7, 5))], op.normalize_attrs({"output_size": [2, 3]}))[0].shape == (2, 3, 2, 3)


# --- layout ---------------------------------------------------------------------------------------
def test_reshape_minus_one_and_errors():
    op = get_op("reshape")
    assert op.infer([TensorSpec((2, 3, 4))], {"shape": [-1]})[0].shape == (24,)
    assert op.infer([TensorSpec((2, 3, 4))], {"shape": [3, -1, 2]})[0].shape == (3, 4, 2)
    with pytest.raises(ShapeError, match=r"cannot reshape \[2, 3, 4\] \(24 elements\) into \[5, -1\]"):
        op.infer([TensorSpec((2, 3, 4))], {"shape": [5, -1]})
    with pytest.raises(ShapeError, match="more than one -1"):
        op.infer([TensorSpec((2, 3, 4))], {"shape": [-1, -1]})
    assert get_op("view") is op


def test_cat_along_each_dim_and_dtype_promotion():
    op = get_op("cat")
    a, b = TensorSpec((2, 3, 4)), TensorSpec((2, 3, 4), "int64")
    for dim in (0, 1, 2, -1, -3):
        want = list(a.shape)
        want[dim] *= 2
        (out,) = op.infer([a, b], {"dim": dim})
        assert out.shape == tuple(want) and out.dtype == "float32"
        ref = op.reference([torch.zeros(a.shape), torch.zeros(b.shape, dtype=torch.int64)], {"dim": dim})
        assert tuple(ref.shape) == out.shape and ref.dtype == torch.float32
    with pytest.raises(ShapeError, match=r"tensor 1 \[2, 5, 4\] does not match tensor 0 \[2, 3, 4\] outside dim 0"):
        op.infer([a, TensorSpec((2, 5, 4))], {"dim": 0})


@pytest.mark.parametrize("start,end,step", [(None, None, 1), (1, -1, 2), (-3, None, 1), (2, 100, 3),
                                            (0, 9223372036854775807, 1), (5, 2, 1), (-100, 3, 1)])
def test_slice_follows_python_rules(start, end, step):
    op = get_op("slice")
    attrs = op.normalize_attrs({"dim": 1, "start": start, "end": end, "step": step})
    x = torch.randn(2, 7)
    assert op.infer([TensorSpec(x.shape)], attrs)[0].shape == tuple(x[:, start:end:step].shape)
    assert torch.equal(op.reference([x], attrs), x[:, start:end:step])


def test_split_and_chunk_piece_counts_match_torch():
    split, chunk = get_op("split"), get_op("chunk")
    x = torch.randn(6, 2)
    for n in (1, 2, 4, 6, 7):
        want = [tuple(t.shape) for t in torch.chunk(x, n)]
        assert [s.shape for s in chunk.infer([TensorSpec(x.shape)], {"chunks": n, "dim": 0})] == want
        want = [tuple(t.shape) for t in torch.split(x, n)]
        assert [s.shape for s in split.infer([TensorSpec(x.shape)], {"split_size_or_sections": [n], "dim": 0})] == want
    assert [s.shape for s in split.infer([TensorSpec(x.shape)], {"split_size_or_sections": [1, 5], "dim": 0})] == \
        [(1, 2), (5, 2)]


def test_multi_output_node_gets_one_value_per_piece():
    p = Program()
    x = p.add_input("x", (7, 3))
    node = p.add_node("split", [x.id], {"split_size_or_sections": [3]})
    assert [p.values[v].shape for v in node.outputs] == [(3, 3), (3, 3), (1, 3)]


def test_expand_permute_and_pad():
    assert get_op("expand").infer([TensorSpec((3, 1))], {"size": [2, 3, 5]})[0].shape == (2, 3, 5)
    with pytest.raises(ShapeError, match="new leading dimension"):
        get_op("expand").infer([TensorSpec((3, 1))], {"size": [-1, 3, 5]})
    assert get_op("permute").infer([TensorSpec((2, 3, 4))], {"dims": [-1, 0, 1]})[0].shape == (4, 2, 3)
    pad = get_op("pad")
    attrs = pad.normalize_attrs({"pad": [2, 1], "mode": "reflect"})
    x = torch.randn(1, 2, 5)
    assert pad.infer([TensorSpec(x.shape)], attrs)[0].shape == tuple(pad.reference([x], attrs).shape)
    with pytest.raises(ShapeError, match="reflect padding 5, 1 must be smaller"):
        pad.infer([TensorSpec(x.shape)], pad.normalize_attrs({"pad": [5, 1], "mode": "reflect"}))


# --- reductions and losses ------------------------------------------------------------------------
def test_reduction_dtypes_follow_torch():
    ints = TensorSpec((3, 4), "int64")
    assert get_op("sum").infer([ints], get_op("sum").normalize_attrs({}))[0] == TensorSpec((), "int64")
    assert get_op("sum").infer([TensorSpec((3,), "bool")], get_op("sum").normalize_attrs({}))[0].dtype == "int64"
    assert get_op("argmax").infer([TensorSpec((3, 4))], get_op("argmax").normalize_attrs({}))[0] == \
        TensorSpec((), "int64")
    assert get_op("logsumexp").infer([ints], get_op("logsumexp").normalize_attrs({"dim": 1}))[0].dtype == "float32"
    assert get_op("softmax").infer([ints], {"dim": 1})[0].dtype == "float32"
    with pytest.raises(ShapeError, match="mean: input must be a floating-point tensor, got int64"):
        get_op("mean").infer([ints], get_op("mean").normalize_attrs({}))
    with pytest.raises(ShapeError, match="names a dimension twice"):
        get_op("sum").infer([TensorSpec((3, 4))], get_op("sum").normalize_attrs({"dim": [1, -1]}))


def test_std_correction_and_norm_match_torch():
    x = torch.randn(4, 6, dtype=torch.float64)
    std = get_op("std")
    assert torch.allclose(std.reference([x], std.normalize_attrs({"dim": 1, "correction": 0})), x.std(1, correction=0))
    norm = get_op("norm")
    assert torch.allclose(norm.reference([x], norm.normalize_attrs({"p": 1.0, "dim": [0]})), x.norm(p=1, dim=0))
    assert torch.allclose(norm.reference([x], norm.normalize_attrs({})), torch.norm(x, p="fro"))


@pytest.mark.parametrize("x,y,red,want", [
    ((4, 5), (4,), "mean", ()), ((4, 5), (4,), "none", (4,)), ((4, 5, 3, 2), (4, 3, 2), "none", (4, 3, 2)),
    ((5,), (), "none", ()), ((4, 5), (4,), "sum", ()),
])
def test_cross_entropy_shapes(x, y, red, want):
    op = get_op("cross_entropy")
    attrs = op.normalize_attrs({"reduction": red})
    (spec,) = op.infer([TensorSpec(x), TensorSpec(y, "int64")], attrs)
    target = torch.randint(0, 5, y)
    assert spec.shape == want == tuple(op.reference([torch.randn(x), target], attrs).shape)


def test_cross_entropy_probability_targets_and_errors():
    op = get_op("cross_entropy")
    attrs = op.normalize_attrs({"label_smoothing": 0.1})
    x, p = torch.randn(3, 4), torch.randn(3, 4).softmax(1)
    assert torch.allclose(op.reference([x, p], attrs), F.cross_entropy(x, p, label_smoothing=0.1))
    assert op.infer([TensorSpec((3, 4)), TensorSpec((3, 4))], attrs)[0].shape == ()
    with pytest.raises(ShapeError, match=r"class-index target must be \[3\] for input \[3, 4\] \(4 classes\), got \[4\]"):
        op.infer([TensorSpec((3, 4)), TensorSpec((4,), "int64")], attrs)
    with pytest.raises(ShapeError, match=r"weight must be \[4\]"):
        op.infer([TensorSpec((3, 4)), TensorSpec((3,), "int64"), TensorSpec((3,))], attrs)


def test_kernelbench_hinge_and_kl_batchmean_match_torch():
    pred, targ = torch.randn(8, 1), torch.randint(0, 2, (8,)).float() * 2 - 1
    hinge = get_op("hinge_loss")
    assert torch.allclose(hinge.reference([pred, targ], hinge.normalize_attrs({})),
                          torch.mean(torch.clamp(1 - pred * targ, min=0)))
    kl = get_op("kl_div")
    a, b = torch.randn(4, 5).softmax(1), torch.randn(4, 5).softmax(1)
    attrs = kl.normalize_attrs({"reduction": "batchmean"})
    assert torch.allclose(kl.reference([a.log(), b], attrs), F.kl_div(a.log(), b, reduction="batchmean"))


# --- opaque -------------------------------------------------------------------------------------------
def test_opaque_runs_a_torch_op_from_a_json_template():
    op = get_op("opaque")
    attrs = op.normalize_attrs({"target": "aten.sum.dim_IntList", "args": [{"input": 0}, [1]],
                                "kwargs": {"keepdim": True, "dtype": {"dtype": "float64"}},
                                "out_specs": [{"shape": [2, 1], "dtype": "float64"}]})
    attrs = op.normalize_attrs(json.loads(json.dumps(attrs)))
    x = torch.randn(2, 3)
    assert op.infer([TensorSpec((2, 3))], attrs) == [TensorSpec((2, 1), "float64")]
    assert torch.allclose(op.reference([x], attrs), x.double().sum(1, keepdim=True))
    packet = op.normalize_attrs({"target": "torch.ops.aten.add", "args": [{"input": 0}, {"input": 1}],
                                 "out_specs": [{"shape": [2, 3]}]})
    assert torch.equal(op.reference([x, x], packet), x + x)


def test_opaque_multi_output_and_declared_spec_mismatch():
    op = get_op("opaque")
    attrs = op.normalize_attrs({"target": "aten.max.dim", "args": [{"input": 0}, 1],
                                "out_specs": [{"shape": [2]}, {"shape": [2], "dtype": "int64"}]})
    vals, idx = op.reference([torch.randn(2, 3)], attrs)
    assert vals.shape == (2,) and idx.dtype == torch.int64
    wrong = op.normalize_attrs({**attrs, "out_specs": [{"shape": [3]}, {"shape": [2], "dtype": "int64"}]})
    with pytest.raises(ProgramError, match=r"output 0 is float32\[2\] but out_specs says float32\[3\]"):
        op.reference([torch.randn(2, 3)], wrong)


@pytest.mark.parametrize("target", ["load_library", "torch.ops.load_library", "aten.__class__", "os.system",
                                    "aten.no_such_op", "aten.add.NoSuchOverload", "builtins.eval",
                                    "aten.add.Tensor.__call__", "__import__.os", "", "aten..add"])
def test_opaque_refuses_anything_but_a_torch_operator(target):
    op = get_op("opaque")
    attrs = op.normalize_attrs({"target": target, "args": [{"input": 0}], "out_specs": [{"shape": [2]}]})
    with pytest.raises(ShapeError, match="opaque: "):
        op.infer([TensorSpec((2,))], attrs)


def test_opaque_template_errors():
    op = get_op("opaque")
    base = {"target": "aten.relu.default", "out_specs": [{"shape": [2]}]}
    for args, msg in (([{"input": 1}], "refers to input 1"), ([{"code": "x"}], "only"),
                      ([{"dtype": "complex32"}], "unknown dtype")):
        with pytest.raises(ShapeError, match=msg):
            op.infer([TensorSpec((2,))], op.normalize_attrs({**base, "args": args}))
    with pytest.raises(ShapeError, match="out_specs"):
        op.infer([TensorSpec((2,))], op.normalize_attrs({**base, "args": [], "out_specs": [{"shape": "2"}]}))


def test_catalog_lists_every_op():
    table = markdown()
    for op in ALL:
        assert f"| `{op.name}` |" in table


def test_ops_doc_table_is_current():
    from pathlib import Path
    doc = Path(__file__).resolve().parent.parent / "docs" / "OPS.md"
    assert catalog_main(["--check", str(doc)]) == 0, "run: python -m agent_core.ops.catalog --write docs/OPS.md"


# --- normalization ----------------------------------------------------------------------------------
def test_batch_norm_eval_and_training_match_the_module():
    op = get_op("batch_norm")
    bn = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 2)
        bn.bias.uniform_(-1, 1)
    x = torch.randn(4, 3, 5, 5)
    params = [bn.running_mean, bn.running_var, bn.weight, bn.bias]
    before = bn.running_mean.clone()
    train = op.reference([x] + params, op.normalize_attrs({"training": True}))
    assert torch.equal(bn.running_mean, before)  # the reference leaves running statistics alone
    bn.eval()
    with torch.no_grad():
        assert torch.allclose(op.reference([x] + params, op.normalize_attrs({})), bn(x), atol=1e-6)
        bn.train()
        assert torch.allclose(train, bn(x), atol=1e-5)


def test_norm_shape_rules():
    ln = get_op("layer_norm")
    with pytest.raises(ShapeError, match=r"weight must be \[4, 5\] \(normalized_shape\), got \[5\]"):
        ln.infer([TensorSpec((2, 4, 5)), TensorSpec((5,))], ln.normalize_attrs({"normalized_shape": [4, 5]}))
    inorm = get_op("instance_norm")
    with pytest.raises(ShapeError, match="use_input_stats=false needs running_mean"):
        inorm.infer([TensorSpec((2, 3, 4))], inorm.normalize_attrs({"use_input_stats": False}))
    x, rm, rv = torch.randn(2, 3, 4), torch.randn(3), torch.rand(3) + 0.5
    out = inorm.reference([x, rm, rv], inorm.normalize_attrs({"use_input_stats": False}))
    assert torch.allclose(out, F.instance_norm(x, rm, rv, use_input_stats=False))
    rms = get_op("rms_norm")
    assert torch.allclose(rms.reference([x], rms.normalize_attrs({"normalized_shape": [4]})),
                          x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps))
    gn = get_op("group_norm")
    with pytest.raises(ShapeError, match=r"weight must be \[6\]"):
        gn.infer([TensorSpec((2, 6, 4)), TensorSpec((3,))], gn.normalize_attrs({"num_groups": 3}))


def test_gathers():
    emb = get_op("embedding")
    idx, w = torch.tensor([[1, 0], [3, 3]]), torch.randn(4, 5)
    assert torch.equal(emb.reference([idx, w], {}), w[idx])
    assert emb.infer([TensorSpec((2, 2), "int64"), TensorSpec((4, 5))], {})[0].shape == (2, 2, 5)
    gather = get_op("gather")
    x, index = torch.randn(3, 4), torch.tensor([[0, 3], [1, 1], [2, 0]])
    assert torch.equal(gather.reference([x, index], {"dim": 1}), torch.gather(x, 1, index))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ALL, ids=IDS)
def test_reference_runs_on_the_gpu_and_matches_the_cpu(op):
    """References take tensors on any device: `stitchcuda run` runs the reference on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    entries, attrs = example(op)
    attrs = op.normalize_attrs(attrs)
    cpu = _draw(entries)
    prev = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = _results(op.reference(cpu, attrs))
            got = _results(op.reference([t.cuda() for t in cpu], attrs))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = prev
    for g, w in zip(got, want):
        assert g.device.type == "cuda" or not cpu, op.name
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.allclose(g.cpu().double(), w.double(), atol=1e-4, rtol=1e-4, equal_nan=True), op.name
