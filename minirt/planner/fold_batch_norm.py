"""Fold an inference-mode BatchNormalization into the Conv before it, as exporters do when they fold constants (a
model exported without that keeps both): W' = W * s per output channel and B' = B * s + t, with s and t the
BatchNorm's per-channel scale and shift (minirt/ops/batch_norm.py), computed in float64. The Conv's weight (and bias)
must be constants read by it alone, and its output read by the BatchNorm alone. Saves the BatchNorm's two
dispatches."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.batch_norm import affine

OPTION = "fold_batch_norm"     # the option that switches this pass off (minirt/planner/__init__.py runs it)


def rewrite(graph, options, profile=None):
    prod, cons = graph.producers(), graph.consumers()
    bn_op = ops.get("BatchNormalization")
    drop = set()
    for bn in graph.nodes:
        conv = prod.get(bn.inputs[0]) if bn.op == "BatchNormalization" and bn.domain in ("", "ai.onnx") else None
        if conv is None or conv.op != "Conv" or conv.domain not in ("", "ai.onnx") or \
                bn.inputs[0] in graph.outputs or len(cons.get(bn.inputs[0], [])) != 1 or \
                bn_op.check(bn, [graph.tensors.get(n) for n in bn.inputs]):
            continue
        w = graph.tensors.get(conv.inputs[1])
        b = graph.tensors.get(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or not w.is_const or len(cons.get(conv.inputs[1], [])) != 1 or \
                (b is not None and (not b.is_const or len(cons.get(conv.inputs[2], [])) != 1)):
            continue
        s, t = (a.reshape(-1) for a in affine(bn, *[graph.tensors[n].data for n in bn.inputs[1:5]], 2))
        w64 = np.asarray(w.data, np.float64)
        bias = (np.zeros(w64.shape[0]) if b is None else np.asarray(b.data, np.float64)) * s + t
        wname = graph.const(graph.fresh_name(f"{conv.inputs[1]}_bn"),
                            (w64 * s.reshape((-1,) + (1,) * (w64.ndim - 1))).astype(np.float32)).name
        bname = graph.const(graph.fresh_name(f"{conv.name}_bn_bias"), bias.astype(np.float32)).name
        conv.inputs[1:] = [wname, bname]
        if isinstance(conv.attrs.get("_wq"), tuple):     # an int8 weight (QDQ): its scales take the BatchNorm's
            wscale, wzero = conv.attrs["_wq"]
            conv.attrs["_wq"] = ((np.asarray(wscale, np.float64) * s).astype(np.float32), wzero)
        conv.outputs[0] = bn.outputs[0]
        drop.add(id(bn))
        graph.note(conv.name, f"folded BatchNormalization '{bn.name}' into the conv's weight and bias")
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    graph.remove_unused()
    return graph
