"""The activations of a QDQ model (onnxruntime's quantize_static, QuantFormat.QDQ) stay float: a QuantizeLinear of a
run-time tensor read only by DequantizeLinears of the same per-tensor scale and zero point becomes, for each of them,
one QuantizeDequantize (minirt/ops/quantize.py): y = clamp(round(x / s), lo - z, hi - z) * s, the pair's float result
as onnxruntime computes each half (x / s in float32, round half to even, (q - z) * s), on the elementwise kernel.
Where its input is already on that grid (another QuantizeDequantize of the same scale and range, through ops that keep
the grid: reshapes, transposes, splits, slices, gathers, Relu, MaxPool) it is the identity and is dropped.
This runs as a graph is prepared (minirt.infer.prepare), before the rank-5 rewrites (minirt/rank5.py): quantize_static
writes a pair after each step of an attention block's q, k, v split, all of the projection's grid, and with them
dropped the rewrites see the exporters' pattern. Any other run-time QuantizeLinear or
DequantizeLinear (an int8 model input or output, a pair of different or per-axis parameters) is refused, naming the
node."""
from __future__ import annotations

import numpy as np

from .errors import UnsupportedError
from .graph import Node
from .ops.quantize import QUANT_RANGE, dq_params, q_params

# ops whose output holds only values of their input (or 0, which is on every grid: the zero point is in range)
_KEEP_GRID = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Relu", "MaxPool", "Split",
              "Slice", "Gather"}


def _pair(graph, q, dq):
    """(scale, lo, hi) of the Q/DQ pair q -> dq, or an UnsupportedError naming what does not fit."""
    where = f"{graph.source}: {dq}"
    ins = [graph.tensor(i) if i else None for i in q.inputs]
    s, z, qtype = q_params(q, ins, f"{graph.source}: ")
    dz = graph.tensor(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else None
    ds, dzz = dq_params(dq, ins[0].shape or (1,), graph.tensor(dq.inputs[1]).data, None if dz is None else dz.data,
                        f"{graph.source}: ")
    if np.any(np.asarray(s) <= 0):
        raise UnsupportedError(f"{graph.source}: {q}: scale '{q.inputs[1]}' is not positive; minirt folds pairs of a "
                               f"positive scale")
    if np.size(s) != 1:
        raise UnsupportedError(f"{graph.source}: {q}: quantizes an activation per axis; minirt folds per-tensor "
                               f"quantize/dequantize pairs only")
    z = 0.0 if z is None else float(np.asarray(z).reshape(-1)[0])
    dzv = 0.0 if dzz is None else np.asarray(dzz, np.float64)
    if dz is not None and dz.data.dtype.name != qtype:
        raise UnsupportedError(f"{where}: zero point '{dz.name}' is {dz.data.dtype}, but {q} makes {qtype}")
    if np.size(ds) != 1 or float(np.asarray(ds).reshape(-1)[0]) != float(np.asarray(s).reshape(-1)[0]) or \
            np.any(dzv != z):
        raise UnsupportedError(f"{where}: dequantizes with other parameters than {q} quantized with; minirt folds "
                               f"pairs of one scale and zero point")
    lo, hi = QUANT_RANGE[qtype]
    return float(np.asarray(s, np.float32).reshape(-1)[0]), float(lo - z), float(hi - z)


def _on_grid(node, prod):
    """Whether node's input already holds values of node's grid (its scale, lo and hi)."""
    cur = prod.get(node.inputs[0])
    while cur is not None and cur.op in _KEEP_GRID:
        cur = prod.get(cur.inputs[0])
    return (cur is not None and cur.op == "QuantizeDequantize" and
            all(cur.attrs[k] == node.attrs[k] for k in ("scale", "lo", "hi")))


def fold_qdq_pairs(graph) -> None:
    prod, cons = graph.producers(), graph.consumers()
    new, drop = {}, set()
    for dq in graph.nodes:
        if dq.op != "DequantizeLinear" or graph.tensor(dq.inputs[0]).is_const:
            continue
        q = prod.get(dq.inputs[0])
        if q is None or q.op != "QuantizeLinear":
            raise UnsupportedError(f"{graph.source}: {dq}: dequantizes '{dq.inputs[0]}', which no QuantizeLinear "
                                   f"makes (an integer model input or another op's output); minirt keeps "
                                   f"activations in float and runs their quantize/dequantize only as pairs")
        readers = cons.get(q.outputs[0], [])
        if q.outputs[0] in graph.outputs or any(r.op != "DequantizeLinear" for r in readers):
            raise UnsupportedError(f"{graph.source}: {q}: its quantized output '{q.outputs[0]}' is read other than "
                                   f"by DequantizeLinears (or is a graph output); minirt keeps activations in float")
        scale, lo, hi = _pair(graph, q, dq)
        new[id(dq)] = Node("QuantizeDequantize", dq.name, [q.inputs[0]], list(dq.outputs),
                           {"scale": scale, "lo": lo, "hi": hi}, "minirt")
        drop.add(id(q))
        graph.note(dq.name, f"QuantizeLinear '{q.name}' -> DequantizeLinear folded into one QuantizeDequantize "
                            f"(scale {scale:g}, levels {lo:g}..{hi:g}) (fold_qdq_pairs)")
    if not new:
        return
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    # a QuantizeDequantize of values already on its grid is the identity: its readers read its input
    prod = graph.producers()
    rename, keep = {}, []
    for n in graph.nodes:
        if n.op == "QuantizeDequantize" and n.outputs[0] not in graph.outputs and _on_grid(n, prod):
            rename[n.outputs[0]] = rename.get(n.inputs[0], n.inputs[0])
            graph.note(n.name, "QuantizeDequantize dropped: its input is already on its grid (fold_qdq_pairs)")
            continue
        n.inputs = [rename.get(i, i) for i in n.inputs]
        keep.append(n)
    graph.nodes = keep
    graph.remove_unused()
