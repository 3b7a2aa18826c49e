"""Regions where windowed poolings feed a reduction, shared by the CPU and GPU tests of the row
kernel's pooling prologue (codegen/layout_graph.py: a window as a lambda of the pooled element's flat
index): level 2's 43 (max_pool3d -> channel log-sum-exp -> relu), 78 (two max pools -> a channel
sum), 8 (max pool -> global average), 65 (avg pool -> sigmoid -> sum), 11 (tanh -> max pool -> group
norm), a channel argmax (an int64 output), and padded, ceil-mode and adaptive windows before a softmax and a layer norm."""
from agent_core.ir import Program
from tests.programs import add_chain

MP3 = {"kernel_size": [2, 2, 2], "stride": [2, 2, 2], "padding": [0, 0, 0], "dilation": [1, 1, 1],
       "ceil_mode": False}
AVG2 = {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0], "ceil_mode": False,
        "count_include_pad": True, "divisor_override": None}
PAD_CEIL = {"kernel_size": [3, 3], "stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "ceil_mode": True}

CASES = {
    "relu_pool_lse_relu": ([2, 6, 4, 6, 8], [("relu", {}), ("max_pool3d", MP3),
                                              ("logsumexp", {"dim": [1], "keepdim": True}), ("relu", {})]),
    "pool_pool_channel_sum": ([2, 6, 8, 8, 12], [("max_pool3d", MP3), ("max_pool3d", MP3),
                                                 ("sum", {"dim": [1], "keepdim": True})]),
    "pool_global_average": ([2, 6, 8, 8, 12], [("max_pool3d", MP3),
                                               ("adaptive_avg_pool3d", {"output_size": [1, 1, 1]})]),
    "avg_pool_sigmoid_sum": ([2, 8, 10, 12], [("avg_pool2d", AVG2), ("sigmoid", {}),
                                              ("sum", {"dim": [1, 2, 3]})]),
    "tanh_pool_group_norm": ([3, 8, 10, 14], [("tanh", {}), ("max_pool2d", {"kernel_size": [2, 2], "stride": [2, 2],
                                                                             "padding": [0, 0], "dilation": [1, 1],
                                                                             "ceil_mode": False}),
                                              ("group_norm", {"num_groups": 4, "eps": 1e-5})]),
    "padded_ceil_pool_softmax": ([3, 4, 9, 33], [("max_pool2d", PAD_CEIL), ("softmax", {"dim": -1})]),
    "pool_channel_argmax": ([2, 5, 8, 12], [("max_pool2d", {"kernel_size": [2, 2], "stride": [2, 2], "padding": [0, 0],
                                                            "dilation": [1, 1], "ceil_mode": False}),
                                             ("argmax", {"dim": 1, "keepdim": False})]),
    "adaptive_pool_layer_norm": ([3, 5, 13, 11], [("adaptive_max_pool2d", {"output_size": [4, 4]}),
                                                  ("flatten", {"start_dim": 1, "end_dim": -1}),
                                                  ("layer_norm", {"normalized_shape": [80], "eps": 1e-5})]),
}


def chain(name: str, case=None):
    """(program, node ids, input shape) of case `name` (or of `case`, (shape, ops)): x -> each op in
    turn -> output."""
    shape, ops = case or CASES[name]
    p = Program(name)
    ids, _ = add_chain(p, p.add_input("x", shape).id, ops)
    return p, ids, shape
