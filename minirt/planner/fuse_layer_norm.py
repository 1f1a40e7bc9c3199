"""Recognise LayerNorm spelt out as exporters write a hand-written one (ConvNeXt's channels-first LayerNorm, models
exported before opset 17):
    u = ReduceMean(x, A); d = x - u; v = ReduceMean(d ** 2, A); y = d / Sqrt(v + eps) [* w] [+ b]
with d ** 2 as Pow(d, 2) or Mul(d, d), w and b constants that vary only along A, and every intermediate read only
inside the pattern. Nine dispatches become one: a LayerNormalization where A is the trailing axes, an AxisLayerNorm
(the layer_norm kernel's per-channel mode) where A is one other axis. Anything else is left as it is."""
from __future__ import annotations

import numpy as np

from ..graph import Node


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
    if not options.pass_on("fuse_layer_norm"):
        return graph
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
