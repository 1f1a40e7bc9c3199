"""Weights of a QDQ model stay int8: a DequantizeLinear of an int8 or uint8 constant W read only as the weight of
MatMul(x, W) or Gemm(x, W, C) (transA 0) becomes that node's Linear with the int8 weight itself and a scale and zero
point per output column (Linear inputs 4 and 5, minirt/quant.py), so the GEMM reads a byte a weight and dequantizes
in registers (ops/int8_weight.py); fuse_linear then takes the bias, activation and residual after it as after a
MatMul. It applies where the quantization is per tensor or per output column (a MatMul's W [K, N] along axis 1, a
transB Gemm's [N, K] along axis 0); a uint8 weight is stored as int8 less 128 with its zero point moved alike, which
is exact. Every other DequantizeLinear of a constant (blocked, along K, of a Conv's weight, read by anything else) is
folded into a float constant here, as load would have, with a note saying why."""
from __future__ import annotations

import numpy as np

from ..graph import Node
from ..ops import attr
from ..ops.quantize import QUANT_DTYPES, dequantize


def _column_params(node, graph, w_shape, col_axis):
    """(scale [N], zero [N] or None) where the DequantizeLinear's parameters are per tensor or per column (axis
    col_axis of W), else None."""
    scale = np.asarray(graph.tensor(node.inputs[1]).data, np.float32)
    zero = graph.tensor(node.inputs[2]).data if len(node.inputs) > 2 and node.inputs[2] else None
    n = w_shape[col_axis]
    if int(attr(node, "block_size", 0)):
        return None
    if scale.size == 1:
        s = np.full(n, scale.reshape(-1)[0], np.float32)
        z = None if zero is None else np.full(n, np.asarray(zero).reshape(-1)[0])
    elif int(attr(node, "axis", 1)) % 2 == col_axis and scale.shape == (n,):
        s, z = scale, zero
    else:
        return None
    return s, z


def _int8(q, zero, n):
    """(int8 q, float32 zero [n] or None): a uint8 weight and its zero point less 128 (exact)."""
    if q.dtype == np.uint8:
        q8 = (q.astype(np.int16) - 128).astype(np.int8)
        z = (np.zeros(n, np.float32) if zero is None else np.asarray(zero, np.float32)) - 128.0
        return q8, z.astype(np.float32)
    z = None if zero is None else np.asarray(zero, np.float32)
    return q, (z if z is not None and z.any() else None)


def _why_not(graph, dq, readers, out):
    if out in graph.outputs or not readers:
        return "its output is a graph output or unread"
    if graph.tensor(dq.inputs[0]).data.ndim != 2:
        return "the weight is not 2-D"
    for r in readers:
        if r.op not in ("MatMul", "Gemm") or r.inputs[1] != out or r.inputs[0] == out:
            return f"{r} reads it other than as a MatMul or Gemm weight"
        x = graph.tensor(r.inputs[0])
        if x.shape is None or not 2 <= len(x.shape) <= (2 if r.op == "Gemm" else 4):
            return f"{r}'s input has no supported shape"
        if r.op == "Gemm":
            c = graph.tensor(r.inputs[2]) if len(r.inputs) > 2 and r.inputs[2] else None
            if attr(r, "transA", 0) or (c is not None and not c.is_const):
                return f"{r} has transA or a run-time C"
    return None


def rewrite(graph, options, profile=None):
    cons = graph.consumers()
    new, drop = {}, set()
    for dq in graph.nodes:
        if dq.op != "DequantizeLinear":
            continue
        ins = [graph.tensor(i) if i else None for i in dq.inputs] + [None] * (3 - len(dq.inputs))
        if not all(t is None or t.is_const for t in ins) or ins[0].data.dtype.name not in QUANT_DTYPES:
            continue
        out = dq.outputs[0]
        readers = cons.get(out, [])
        why = _why_not(graph, dq, readers, out)
        made = {}
        if why is None:
            for r in readers:
                trans = r.op == "Gemm" and int(attr(r, "transB", 0))
                params = _column_params(dq, graph, ins[0].data.shape, 0 if trans else 1)
                if params is None:
                    why = ("its scales are not per tensor or per output column (blocked, or along K): the int8 "
                           "kernels take one scale per column")
                    break
                made[id(r)] = _linear(graph, dq, r, params, trans)
        if why is not None:
            graph.const(out, dequantize(dq, ins[0].data, ins[1].data, None if ins[2] is None else ins[2].data,
                                        f"{graph.source}: "))
            graph.note(dq.name, f"folded to a float constant ({why})")
            drop.add(id(dq))
            continue
        new.update(made)
        drop.add(id(dq))
        for r in readers:
            graph.note(r.name, f"int8 weight '{dq.inputs[0]}' from {dq} (fold_dequantize_linear)")
    if not drop:
        return graph
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    graph.remove_unused()
    return graph


def _linear(graph, dq, r, params, trans):
    """The Linear standing for MatMul / Gemm `r` over DequantizeLinear `dq`'s int8 weight."""
    s, z = params
    q = graph.tensor(dq.inputs[0]).data
    q8, z8 = _int8(q, z, len(s))
    if trans:
        q8 = q8.T
    q8 = np.ascontiguousarray(q8)
    bias = ""
    if r.op == "Gemm":
        s = s * np.float32(attr(r, "alpha", 1.0))
        c = graph.tensor(r.inputs[2]) if len(r.inputs) > 2 and r.inputs[2] else None
        beta = float(attr(r, "beta", 1.0))
        if c is not None and beta != 0:
            n = q8.shape[1]
            b = beta * np.broadcast_to(np.asarray(c.data, np.float32).reshape(-1), (n,))
            bias = graph.const(graph.fresh_name(f"{r.name}.bias"), np.ascontiguousarray(b, np.float32)).name
    wq = graph.const(graph.fresh_name(f"{dq.inputs[0]}@int8"), q8).name
    ws = graph.const(graph.fresh_name(f"{dq.inputs[0]}@scale"), np.ascontiguousarray(s, np.float32)).name
    wz = graph.const(graph.fresh_name(f"{dq.inputs[0]}@zero"), z8).name if z8 is not None else ""
    return Node("Linear", r.name, [r.inputs[0], wq, bias, "", ws, wz], list(r.outputs), {"act": "", "scale": 1.0},
                "minirt")
