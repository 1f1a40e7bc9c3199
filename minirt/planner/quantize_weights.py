"""Session option quantize_weights="int8": every Linear (fuse_linear's) with a float constant 2-D weight gets that
weight quantized per output column, symmetric, to int8 (as CTranslate2 quantizes its rows: minirt/quant.py), with the
scale as the Linear's input 4, so it runs on the int8 GEMM kernels and holds a byte a weight on the GPU. Before
merge_siblings, so q, k and v merge as int8. Left alone, with a note: weights the int8 kernels would not read
(texture storage, K not a multiple of 4, fast_gemm off), where they would only be dequantized again.
A Conv on a route of the buffer GEMM (conv_routing's im2col and linear) gets _wq "int8": its lowering (ops/conv.py)
quantizes the weight per output channel, symmetric, as for a Linear; convs on the other routes (pointwise,
depthwise, direct: no int8 kernel) stay float, with a note."""
from __future__ import annotations

import numpy as np

from ..quant import quantize_rows


def rewrite(graph, options, profile=None):
    if options.quantize_weights != "int8":
        return graph
    for node in graph.nodes:
        if node.op == "Conv" and node.domain in ("", "ai.onnx") and "_wq" not in node.attrs:
            _conv(graph, node, options)
            continue
        if node.op != "Linear" or node.domain != "minirt" or (len(node.inputs) > 4 and node.inputs[4]):
            continue
        w = graph.tensor(node.inputs[1])
        if not w.is_const or w.data.ndim != 2 or w.data.dtype != np.float32:
            continue
        k = w.data.shape[0]
        if options.planned_storage != "buffer" or k % 4 or not options.fast_gemm:
            graph.note(node.name, "quantize_weights int8: left float (the int8 kernels need buffer storage and K a "
                                  "multiple of 4)")
            continue
        q = quantize_rows(w.data.T, w.name)
        qk, s = q.kn()
        ins = list(node.inputs) + [""] * (4 - len(node.inputs))
        qname = graph.const(graph.fresh_name(f"{w.name}@int8"), qk).name
        sname = graph.const(graph.fresh_name(f"{w.name}@scale"), s).name
        node.inputs = ins[:1] + [qname] + ins[2:4] + [sname, ""]
        graph.note(node.name, f"quantize_weights int8: '{w.name}' [{k}, {qk.shape[1]}] as int8 with a scale a column")
    graph.remove_unused()
    return graph


def _conv(graph, node, options):
    w = graph.tensor(node.inputs[1])
    route = node.attrs.get("_route", "direct")
    if not w.is_const or w.data.dtype != np.float32:
        return
    if route not in ("im2col", "linear") or options.planned_storage != "buffer" or not options.fast_gemm:
        graph.note(node.name, f"quantize_weights int8: left float (route {route}, {options.planned_storage} storage: "
                              f"the int8 kernels are the buffer GEMM's)")
        return
    node.attrs["_wq"] = "int8"
    graph.note(node.name, f"quantize_weights int8: weight '{w.name}' {list(w.data.shape)} as int8 with a scale an "
                          f"output channel (route {route})")
