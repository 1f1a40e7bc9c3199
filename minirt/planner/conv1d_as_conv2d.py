"""conv1d as conv2d: rewrite an eligible 1-D Conv into Reshape -> 2-D Conv over a height of 1 ->
Reshape, so the 2-D im2col + tiled GEMM path runs it. A direct 1-D kernel computes one output per
invocation with no reuse; as a 2-D conv it becomes one GEMM (ExecuTorch measured 20x on Whisper's
front end on an Adreno 840).

Eligible only when all hold (otherwise the conv stays 1-D and the reason is noted):
  the weight is a constant with exactly one consumer (reshaping a shared weight would break the
  others); groups 1; dilation 1; out_channels >= IM2COL_MIN_COUT (so the result surely takes
  im2col); kernel size > 1 (pointwise and depthwise have their own kernels); a concrete batch."""
from __future__ import annotations

import numpy as np

from ..graph import Node, Tensor
from ..ops.conv import conv_params
from .conv_routing import IM2COL_MIN_COUT


def why_not(node, graph, consumers) -> str | None:
    x, w = graph.tensor(node.inputs[0]), graph.tensor(node.inputs[1])
    if x.shape is None or len(x.shape) != 3:
        return "not a 1-D conv"
    if not w.is_const:
        return "weight is computed at run time"
    if len(consumers.get(node.inputs[1], [])) != 1:
        return f"weight is shared by {len(consumers[node.inputs[1]])} nodes"
    if int(node.attrs.get("group", 1)) != 1:
        return f"groups {node.attrs['group']} != 1"
    if list(node.attrs.get("dilations", [1])) != [1]:
        return f"dilation {list(node.attrs['dilations'])} != 1"
    if w.shape[0] < IM2COL_MIN_COUT:
        return f"out_channels {w.shape[0]} < {IM2COL_MIN_COUT}"
    if w.shape[2] <= 1:
        return "kernel size 1 (pointwise kernel)"
    if not isinstance(x.shape[0], int):
        return f"batch '{x.shape[0]}' is symbolic"
    if not isinstance(x.shape[2], int):
        return "length is symbolic"
    return None


def rewrite(graph, options, profile=None):
    if not options.conv1d_rewrite:
        for n in graph.nodes:
            if n.op == "Conv" and graph.tensor(n.inputs[0]).shape and len(graph.tensor(n.inputs[0]).shape) == 3:
                graph.note(n.name, "conv1d rewrite: off (option)")
        return graph
    consumers = graph.consumers()
    out_nodes = []
    for node in graph.nodes:
        if node.op != "Conv":
            out_nodes.append(node)
            continue
        reason = why_not(node, graph, consumers)
        if reason == "not a 1-D conv":
            out_nodes.append(node)
            continue
        if reason:
            graph.note(node.name, f"conv1d rewrite: no ({reason})")
            out_nodes.append(node)
            continue
        out_nodes.extend(_rewrite_one(node, graph))
        graph.note(node.name, "conv1d rewrite: yes (1-D conv as 2-D over height 1)")
    graph.nodes = out_nodes
    return graph


def _rewrite_one(node, graph):
    x, w = graph.tensor(node.inputs[0]), graph.tensor(node.inputs[1])
    y = graph.tensor(node.outputs[0])
    n, c, length = x.shape
    o, i, k = w.shape
    strides, dil, pb, pe, (lout,) = conv_params(node, [length], [k])
    x4 = graph.add_tensor(Tensor(graph.fresh_name(f"{node.inputs[0]}@h1"), (n, c, 1, length), x.dtype))
    y4 = graph.add_tensor(Tensor(graph.fresh_name(f"{node.outputs[0]}@h1"), (n, o, 1, lout), y.dtype))
    # The weight has exactly one consumer, so replacing the constant in place is safe.
    w.data = np.ascontiguousarray(w.data.reshape(o, i, 1, k))
    w.shape = (o, i, 1, k)
    s_in = graph.const(graph.fresh_name(f"{x4.name}.shape"), np.array(x4.shape, np.int64))
    s_out = graph.const(graph.fresh_name(f"{y4.name}.shape"), np.array(y.shape, np.int64))
    attrs = {"strides": [1, strides[0]], "pads": [0, pb[0], 0, pe[0]], "dilations": [1, dil[0]], "group": 1,
             "kernel_shape": [1, k], **{a: node.attrs[a] for a in ("_wq",) if a in node.attrs}}
    return [Node("Reshape", f"{node.name}/to_2d", [node.inputs[0], s_in.name], [x4.name]),
            Node("Conv", node.name, [x4.name, *node.inputs[1:]], [y4.name], attrs, node.domain),
            Node("Reshape", f"{node.name}/to_1d", [y4.name, s_out.name], [node.outputs[0]])]
