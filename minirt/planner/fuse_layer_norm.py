"""Recognise LayerNorm spelt out as exporters write a hand-written one (ConvNeXt's channels-first LayerNorm, models
exported before opset 17):
    u = ReduceMean(x, A); d = x - u; v = ReduceMean(d ** 2, A); y = d / Sqrt(v + eps) [* w] [+ b]
with d ** 2 as Pow(d, 2) or Mul(d, d), w and b constants that vary only along A, and every intermediate read only
inside the pattern. Nine dispatches become one: a LayerNormalization where A is the trailing axes, an AxisLayerNorm
(the layer_norm kernel's per-channel mode) where A is one other axis. Anything else is left as it is.

GroupNorm as exporters write it, x [N, C, ...] -> Reshape [N, G, -1] -> InstanceNormalization (constant scale and
bias) [-> Reshape back] [* w] [+ b] with w and b one value per channel, becomes one InstanceNormalization of x with
the affine folded in where each group is one channel (G = C: wav2vec2's feature extractor); with G < C the Mul and
Add stay, as the per-channel scale does not fit the kernel's per-group rows."""
from __future__ import annotations

import numpy as np

from ..graph import Node

OPTION = "fuse_layer_norm"     # the option that switches this pass off (minirt/planner/__init__.py runs it)


def _ints(graph, node):
    """ReduceMean's axes (attribute before opset 18, input after), or None."""
    if len(node.inputs) > 1 and node.inputs[1]:
        t = graph.tensors.get(node.inputs[1])
        return None if t is None or not t.is_const else [int(a) for a in np.asarray(t.data).reshape(-1)]
    return node.attrs.get("axes")


def _scalar(graph, name):
    t = graph.tensors.get(name)
    return float(np.asarray(t.data).reshape(-1)[0]) if t is not None and t.is_const and t.data.size == 1 else None


def _other(node, name):
    a, b = node.inputs
    return b if a == name else a if b == name else None


def rewrite(graph, options, profile=None):
    _group_norms(graph)
    cons = graph.consumers()

    def only(name, op, n=1):
        """The reader of `name` (read `n` times by it and by nothing else, not an output) if its op is `op`."""
        c = cons.get(name, [])
        return c[0] if len(c) == n and all(r is c[0] for r in c) and c[0].op == op and name not in graph.outputs \
            and c[0].domain in ("", "ai.onnx") else None

    drop, new = set(), {}
    for mean in graph.nodes:
        if mean.op != "ReduceMean" or mean.domain not in ("", "ai.onnx") or mean.attrs.get("keepdims", 1) != 1:
            continue
        x, axes = mean.inputs[0], _ints(graph, mean)
        shape = graph.tensors[x].shape
        if not axes or shape is None or not graph.tensors[x].is_static:
            continue
        rank = len(shape)
        axes = sorted({a % rank for a in axes})
        sub = only(mean.outputs[0], "Sub")
        if sub is None or sub.inputs != [x, mean.outputs[0]]:
            continue
        d = sub.outputs[0]
        divs = [r for r in cons.get(d, []) if r.op == "Div" and r.inputs[0] == d]
        sqs = [r for r in cons.get(d, []) if not divs or r is not divs[0]]
        if len(divs) != 1 or not sqs or any(r is not sqs[0] for r in sqs) or d in graph.outputs:
            continue
        div, sq = divs[0], sqs[0]
        if not ((sq.op == "Pow" and len(sqs) == 1 and sq.inputs[0] == d and _scalar(graph, sq.inputs[1]) == 2.0)
                or (sq.op == "Mul" and sq.inputs == [d, d])):
            continue
        var = only(sq.outputs[0], "ReduceMean")
        if var is None or var.attrs.get("keepdims", 1) != 1 or \
                sorted({a % rank for a in _ints(graph, var) or []}) != axes:
            continue
        add = only(var.outputs[0], "Add")
        eps = _scalar(graph, _other(add, var.outputs[0])) if add is not None else None
        sqrt = only(add.outputs[0], "Sqrt") if eps is not None else None
        if sqrt is None or only(sqrt.outputs[0], "Div") is not div:
            continue
        chain, out, affine = [mean, sub, sq, var, add, sqrt, div], div.outputs[0], []
        for op in ("Mul", "Add"):
            nxt = only(out, op)
            c = _other(nxt, out) if nxt is not None else None
            t = graph.tensors.get(c) if c else None
            if t is None or not t.is_const or len(t.shape) > rank or any(
                    s != 1 for i, s in enumerate((1,) * (rank - len(t.shape)) + tuple(t.shape)) if i not in axes):
                affine.append(None)
                continue
            chain.append(nxt)
            out = nxt.outputs[0]
            affine.append(np.asarray(t.data, np.float32).reshape((1,) * (rank - t.data.ndim) + t.data.shape))
        norm = tuple(shape[a] for a in axes)
        if axes == list(range(axes[0], rank)):
            op, attrs, domain, keep = "LayerNormalization", {"axis": axes[0], "epsilon": eps}, "", norm
        elif len(axes) == 1 and rank <= 4:
            op, attrs, domain, keep = "AxisLayerNorm", {"axis": axes[0], "epsilon": eps}, "minirt", norm
        else:
            continue
        scale, bias = (np.broadcast_to(a[tuple(slice(None) if i in axes else 0 for i in range(rank))]
                                       if a is not None else np.float32(v), keep).astype(np.float32)
                       for a, v in zip(affine, (1.0, 0.0)))
        names = [graph.const(graph.fresh_name(f"{mean.name}/ln_{w}"), a).name for w, a in (("scale", scale),
                                                                                          ("bias", bias))]
        drop.update(id(n) for n in chain)
        new[id(chain[-1])] = Node(op, f"{mean.name}/ln", [x, *names], [out], attrs, domain)
        graph.note(new[id(chain[-1])].name, f"fused the {len(chain)}-node LayerNorm over axes {axes} into one {op}")
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
    graph.remove_unused()
    return graph


def _per_channel(graph, name, rank, c):
    """The constant `name` as C values if it varies only along axis 1 of a rank-`rank` tensor with C channels."""
    t = graph.tensors.get(name)
    if t is None or not t.is_const or t.data.ndim > rank:
        return None
    a = np.asarray(t.data, np.float64).reshape((1,) * (rank - t.data.ndim) + t.data.shape)
    if any(d != 1 for i, d in enumerate(a.shape) if i != 1) or a.shape[1] not in (1, c):
        return None
    return np.broadcast_to(a.reshape(-1), (c,))


def _group_norms(graph):
    prod, cons = graph.producers(), graph.consumers()

    def sole(name):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and name not in graph.outputs and c[0].domain in ("", "ai.onnx") else None

    drop, new = set(), {}
    for inorm in graph.nodes:
        if inorm.op != "InstanceNormalization" or inorm.domain not in ("", "ai.onnx"):
            continue
        r = prod.get(inorm.inputs[0])
        x = graph.tensors.get(r.inputs[0]) if r is not None and r.op == "Reshape" else None
        if x is None or not x.is_static or len(x.shape) not in (3, 4) or sole(inorm.inputs[0]) is not inorm:
            continue
        c, g = x.shape[1], graph.tensors[inorm.inputs[0]].shape[1]
        ts = [graph.tensors.get(n) for n in inorm.inputs[1:3]]
        if g != c or any(t is None or not t.is_const or t.data.size != g for t in ts):
            continue
        scale, bias = (np.asarray(t.data, np.float64).reshape(-1) for t in ts)
        chain, out = [r, inorm], inorm.outputs[0]
        back = sole(out)
        if back is not None and back.op == "Reshape" and graph.tensors[back.outputs[0]].shape == x.shape:
            chain.append(back)
            out = back.outputs[0]
        elif graph.tensors[out].shape != x.shape:
            continue
        for op in ("Mul", "Add"):
            nxt = sole(out)
            v = _per_channel(graph, _other(nxt, out), len(x.shape), c) if nxt is not None and nxt.op == op else None
            if v is None:
                continue
            scale, bias = (scale * v, bias * v) if op == "Mul" else (scale, bias + v)
            chain.append(nxt)
            out = nxt.outputs[0]
        names = [graph.const(graph.fresh_name(f"{inorm.name}/gn_{w}"), a.astype(np.float32)).name
                 for w, a in (("scale", scale), ("bias", bias))]
        drop.update(id(n) for n in chain)
        new[id(chain[-1])] = Node("InstanceNormalization", inorm.name, [x.name, *names], [out], dict(inorm.attrs))
        graph.note(inorm.name, f"GroupNorm of one channel a group ({len(chain)} nodes) as one InstanceNormalization "
                               f"with its affine")
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
    graph.remove_unused()
