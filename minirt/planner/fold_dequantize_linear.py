"""Weights of a QDQ model stay quantized: a DequantizeLinear of an int8, uint8, int4 or uint4 constant W read only as
the weight of MatMul(x, W) or Gemm(x, W, C) (transA 0) becomes that node's Linear with the quantized weight itself, so
the GEMM reads a byte (or half a byte) a weight and dequantizes in registers (ops/int8_weight.py); fuse_linear then
takes the bias, activation and residual after it as after a MatMul.
  - per tensor or per output column (a MatMul's W [K, N] along axis 1, a transB Gemm's [N, K] along axis 0): the int8
    weight with a scale and zero point per column (Linear inputs 4 and 5, minirt/quant.py); a uint8 (uint4) weight
    is stored as int8 less 128 with its zero point moved alike, an int4 one as int8: both exact.
  - blocked along K (opset 21's block_size, a multiple of 4), of values that fit 4 bits (int4 / uint4, as
    onnxruntime's 4-bit QDQ writes them): a Linear of attribute `block` whose W is uint8 values 0..15 (int4 plus 8,
    its zero point moved alike) with scale and zero point [blocks, N], run on the w=q4 kernels as MatMulNBits is.
A DequantizeLinear read only as Conv weights (input 1), per tensor or per output channel (axis 0), is folded to its
float weight, and each Conv gets attribute _wq = (scale [O], zero point [O] in int8 terms or None): its GEMM routes
(im2col, linear) read the weight as int8 again (exactly: q = W / scale + zero is whole), other routes read the float
weight (ops/conv.py). Every other DequantizeLinear of a constant (blocked 8-bit, along K, read by anything else) is
folded into a float constant here, as load would have, with a note saying why."""
from __future__ import annotations

import numpy as np

from ..graph import Node
from ..ops import attr
from ..ops.quantize import QUANT_DTYPES, check_zero_range, dequantize


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
    elif int(attr(node, "axis", 1)) % len(w_shape) == col_axis and scale.shape == (n,):
        s, z = scale, zero
    else:
        return None
    return s, z


def _block_params(node, graph, w_shape, k_axis):
    """(scale, zero or None, block) of a DequantizeLinear blocked along K (axis k_axis of the 2-D W), else None."""
    block = int(attr(node, "block_size", 0))
    if not block or int(attr(node, "axis", 1)) % 2 != k_axis:
        return None
    zero = graph.tensor(node.inputs[2]).data if len(node.inputs) > 2 and node.inputs[2] else None
    return np.asarray(graph.tensor(node.inputs[1]).data, np.float32), zero, block


def _int8(q, zero, n):
    """(int8 q, float32 zero [n] or None): a uint8 (uint4) weight and its zero point less 128, an int4 one as int8
    (exact)."""
    if q.dtype.name in ("uint8", "uint4"):
        q8 = (q.astype(np.int16) - 128).astype(np.int8)
        z = (np.zeros(n, np.float32) if zero is None else np.asarray(zero, np.float32)) - 128.0
        return q8, z.astype(np.float32)
    z = None if zero is None else np.asarray(zero, np.float32)
    return q.astype(np.int8), (z if z is not None and z.any() else None)


def _nibbles(q, zero):
    """(uint8 values 0..15, float32 zero) of a weight whose values fit 4 bits (a signed one plus 8, its zero point
    moved alike: exact), else None."""
    signed = q.dtype.name in ("int8", "int4")
    lo, hi = (-8, 7) if signed else (0, 15)
    qi = q.astype(np.int16)
    if qi.size and (qi.min() < lo or qi.max() > hi):
        return None
    z = np.zeros(1, np.float32) if zero is None else np.asarray(zero, np.float32)
    return (qi - lo).astype(np.uint8), z - lo


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


def _conv_params(graph, dq, readers, out):
    """(scale [O], int8-terms zero [O] or None) where every reader is a Conv reading `out` as its weight alone and the
    parameters are per tensor or per output channel, else None."""
    w = graph.tensor(dq.inputs[0]).data
    if out in graph.outputs or not readers or w.ndim not in (3, 4):
        return None
    if any(r.op != "Conv" or r.domain not in ("", "ai.onnx") or r.inputs[1] != out or
           out in (r.inputs[:1] + r.inputs[2:]) for r in readers):
        return None
    params = _column_params(dq, graph, w.shape, 0)
    if params is None:
        return None
    s, z = params
    _q8, z8 = _int8(w[:1].reshape(1, -1), z, len(s))     # the zero point in the int8 terms conv.py reads q in
    return s.astype(np.float32), z8


def rewrite(graph, options, profile=None):
    cons = graph.consumers()
    new, drop = {}, set()
    for dq in graph.nodes:
        if dq.op != "DequantizeLinear":
            continue
        ins = [graph.tensor(i) if i else None for i in dq.inputs] + [None] * (3 - len(dq.inputs))
        if not all(t is None or t.is_const for t in ins) or ins[0].data.dtype.name not in QUANT_DTYPES:
            continue
        if ins[2] is not None:
            check_zero_range(dq, ins[2].name, ins[2].data, ins[0].data.dtype.name, f"{graph.source}: ")
        out = dq.outputs[0]
        readers = cons.get(out, [])
        conv = _conv_params(graph, dq, readers, out)
        why = None if conv is not None else _why_not(graph, dq, readers, out)
        made = {}
        if why is None and conv is None:
            for r in readers:
                made[id(r)] = _linear(graph, dq, r)
                if isinstance(made[id(r)], str):
                    why = made[id(r)]
                    break
        if conv is not None or why is not None:
            graph.const(out, dequantize(dq, ins[0].data, ins[1].data, None if ins[2] is None else ins[2].data,
                                        f"{graph.source}: "))
            drop.add(id(dq))
            if conv is not None:
                for r in readers:
                    r.attrs["_wq"] = conv
                    graph.note(r.name, f"int8 weight '{dq.inputs[0]}' from {dq}, a scale an output channel: the GEMM "
                                       f"routes read it as int8 (fold_dequantize_linear)")
            else:
                graph.note(dq.name, f"folded to a float constant ({why})")
            continue
        new.update(made)
        drop.add(id(dq))
        for r in readers:
            kind = "4-bit" if "block" in made[id(r)].attrs else "int8"
            graph.note(r.name, f"{kind} weight '{dq.inputs[0]}' from {dq} (fold_dequantize_linear)")
    if not drop:
        return graph
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    graph.remove_unused()
    return graph


def _linear(graph, dq, r):
    """The Linear standing for MatMul / Gemm `r` over DequantizeLinear `dq`'s quantized weight, or why there is none."""
    trans = r.op == "Gemm" and int(attr(r, "transB", 0))
    q = graph.tensor(dq.inputs[0]).data
    block = None
    params = _column_params(dq, graph, q.shape, 0 if trans else 1)
    if params is not None:
        s, z = params
        q8, z8 = _int8(q, z, len(s))
    else:
        bp = _block_params(dq, graph, q.shape, 1 if trans else 0)
        if bp is None:
            return ("its scales are not per tensor, per output column or blocked along K: the quantized kernels "
                    "take one scale per column or per block of K")
        s, z, block = bp
        nib = _nibbles(q, z)
        if nib is None or block % 4:
            return (f"blocked along K with block_size {block}: the blocked kernels take 4-bit values and a block "
                    f"size that is a multiple of 4")
        q8, z8 = nib
        if z is None:
            z8 = np.full(s.shape, z8[0], np.float32)
        if trans:
            s, z8 = s.T, z8.T
    if trans:
        q8 = q8.T
    q8 = np.ascontiguousarray(q8)
    bias = ""
    n = q8.shape[1]
    if r.op == "Gemm":
        s = s * np.float32(attr(r, "alpha", 1.0))
        c = graph.tensor(r.inputs[2]) if len(r.inputs) > 2 and r.inputs[2] else None
        beta = float(attr(r, "beta", 1.0))
        if c is not None and beta != 0:
            b = beta * np.broadcast_to(np.asarray(c.data, np.float32).reshape(-1), (n,))
            bias = graph.const(graph.fresh_name(f"{r.name}.bias"), np.ascontiguousarray(b, np.float32)).name
    tag = "q4" if block else "int8"
    wq = graph.const(graph.fresh_name(f"{dq.inputs[0]}@{tag}"), q8).name
    ws = graph.const(graph.fresh_name(f"{dq.inputs[0]}@scale"), np.ascontiguousarray(s, np.float32)).name
    wz = graph.const(graph.fresh_name(f"{dq.inputs[0]}@zero"),
                     np.ascontiguousarray(z8, np.float32)).name if z8 is not None else ""
    attrs = {"act": "", "scale": 1.0}
    if block:
        attrs["block"] = block
    return Node("Linear", r.name, [r.inputs[0], wq, bias, "", ws, wz], list(r.outputs), attrs, "minirt")
