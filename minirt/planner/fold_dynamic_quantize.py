"""onnxruntime's quantize_dynamic output on the int8 GEMM: DynamicQuantizeLinear(x) -> (xq, xs, xz), then
MatMulInteger(xq, W, xz, wz) with W an int8 or uint8 constant [K, N] and wz per tensor or per column, then a Cast to
float. The DynamicQuantizeLinear becomes minirt's DynamicQuantize (xq - xz as whole numbers, and xs: the same uint8
rounding on the GPU), and each MatMulInteger with its Cast a Linear of that over the int8 weight with its zero point
(scale 1): the sums MatMulInteger makes, in float (exact while they stay below 2^24). The Mul by xs times the weight
scale after it is left as it is. Anything else reading the quantized tensors, or a MatMulInteger whose weight is not
such a constant, leaves the group alone (and the ops unsupported)."""
from __future__ import annotations

import numpy as np

from ..graph import Node, Tensor
from .fold_dequantize_linear import _int8


def _weight(graph, mi):
    """(int8 W [K, N], float zero [N] or None) of a MatMulInteger's constant weight and zero point, else None."""
    w = graph.tensor(mi.inputs[1])
    if not w.is_const or w.data.ndim != 2 or w.data.dtype.name not in ("int8", "uint8"):
        return None
    n = w.data.shape[1]
    z = graph.tensor(mi.inputs[3]).data if len(mi.inputs) > 3 and mi.inputs[3] else None
    if z is not None:
        if not graph.tensor(mi.inputs[3]).is_const or z.size not in (1, n):
            return None
        z = np.broadcast_to(np.asarray(z).reshape(-1), (n,))
    return _int8(w.data, z, n)


def rewrite(graph, options, profile=None):
    cons = graph.consumers()
    new, drop = {}, set()
    for dq in graph.nodes:
        if dq.op != "DynamicQuantizeLinear" or len(dq.outputs) < 3:
            continue
        xq, xs, xz = dq.outputs[:3]
        readers = cons.get(xq, [])
        plan = []
        for mi in readers:
            casts = cons.get(mi.outputs[0], [])
            ok = (mi.op == "MatMulInteger" and mi.inputs[0] == xq and len(mi.inputs) > 2 and mi.inputs[2] == xz
                  and len(casts) == 1 and casts[0].op == "Cast" and int(casts[0].attrs.get("to", 0)) == 1
                  and mi.outputs[0] not in graph.outputs)
            w = _weight(graph, mi) if ok else None
            if w is None:
                plan = None
                break
            plan.append((mi, casts[0], w))
        others = [n for n in cons.get(xz, []) if n.op != "MatMulInteger"]
        if not plan or others or xq in graph.outputs or xz in graph.outputs:
            continue
        centered = graph.fresh_name(f"{xq}@centered")
        graph.add_tensor(Tensor(centered, graph.tensor(xq).shape, "float32"))
        new[id(dq)] = Node("DynamicQuantize", dq.name, [dq.inputs[0]], [centered, xs], {}, "minirt")
        for mi, cast, (q8, z8) in plan:
            n = q8.shape[1]
            wq = graph.const(graph.fresh_name(f"{mi.inputs[1]}@int8"), np.ascontiguousarray(q8)).name
            ones = graph.const(graph.fresh_name(f"{mi.inputs[1]}@unit_scale"), np.ones(n, np.float32)).name
            wz = graph.const(graph.fresh_name(f"{mi.inputs[1]}@zero"), z8).name if z8 is not None else ""
            new[id(cast)] = Node("Linear", mi.name, [centered, wq, "", "", ones, wz], list(cast.outputs),
                                 {"act": "", "scale": 1.0}, "minirt")
            drop.add(id(mi))
            graph.note(mi.name, f"MatMulInteger + Cast on the int8 GEMM over {dq}'s quantized input "
                                f"(fold_dynamic_quantize)")
    if not new:
        return graph
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    graph.remove_unused()
    return graph
