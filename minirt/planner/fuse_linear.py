"""Fuse a linear layer into one Linear node: MatMul(x, W) with W a 2-D constant, then optionally, each
only when the previous result has no other reader: Add of a constant bias over the last dim, Mul by
a scalar constant (attention's q scaling: folded into W and b), Gelu or Relu, and Add of a runtime
tensor of the same shape (the residual). One GEMM dispatch then does it all in its epilogue.
A Gemm (a classifier head: x [M, K], constant B, transA 0, a constant C of N values or none) starts the same chain,
with alpha and transB folded into W and beta into the bias: at one row it runs on the few-row kernel (linear_rows)."""
from __future__ import annotations

import numpy as np

from ..graph import Node
from ..kernels import activation_of
from ..ops import attr

OPTION = "fuse_linear"     # the option that switches this pass off (minirt/planner/__init__.py runs it)


def rewrite(graph, options, profile=None):
    cons = graph.consumers()
    drop, new = set(), {}

    def sole(name):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and name not in graph.outputs else None

    def other(node, name):
        a, b = node.inputs
        return b if a == name else a

    for mm in graph.nodes:
        # a Linear of fold_dequantize_linear (an int8 weight, nothing fused yet) starts a chain as a MatMul does
        start = mm.op == "Linear" and len(mm.inputs) > 4 and not mm.inputs[3] and not mm.attrs.get("act") \
            and "parts" not in mm.attrs
        if (mm.op not in ("MatMul", "Gemm") and not start) or id(mm) in drop:
            continue
        wname, bias = mm.inputs[1], mm.inputs[2] if start else ""
        if mm.op == "Gemm":
            gemm = _gemm_weights(mm, graph)
            if gemm is None:
                continue
            wname, bias = gemm
        w = graph.tensor(wname)
        x = graph.tensor(mm.inputs[0])
        if not w.is_const or w.data.ndim != 2 or x.shape is None or not 2 <= len(x.shape) <= 4:
            continue
        n = w.data.shape[1]
        chain, cur = [mm], mm.outputs[0]
        scale, act, res = 1.0, "", ""
        nxt = sole(cur)
        if nxt is not None and nxt.op == "Add" and not bias:
            b = graph.tensor(other(nxt, cur))
            if b.is_const and b.data.size == n and b.data.shape[-1:] == (n,):
                bias = b.name
                chain.append(nxt)
                cur = nxt.outputs[0]
                nxt = sole(cur)
        if nxt is not None and nxt.op == "Mul":
            s = graph.tensor(other(nxt, cur))
            if s.is_const and s.data.size == 1:
                scale = float(s.data.reshape(-1)[0])
                chain.append(nxt)
                cur = nxt.outputs[0]
                nxt = sole(cur)
        if nxt is not None and activation_of(nxt.op, nxt.attrs):
            act = activation_of(nxt.op, nxt.attrs)
            chain.append(nxt)
            cur = nxt.outputs[0]
            nxt = sole(cur)
        if nxt is not None and nxt.op == "Add":
            r = graph.tensor(other(nxt, cur))
            y = graph.tensor(cur)
            if not r.is_const and r.shape == y.shape and r.name != cur:
                res = r.name
                chain.append(nxt)
                cur = nxt.outputs[0]
        if bias:
            graph.tensor(bias).data = np.asarray(graph.tensor(bias).data, np.float32).reshape(-1)
        node = Node("Linear", mm.name, [mm.inputs[0], wname, bias, res, *mm.inputs[4:6]], [cur],
                    {"act": act, "scale": scale * float(mm.attrs.get("scale", 1.0)),
                     **{k: mm.attrs[k] for k in ("block",) if k in mm.attrs}}, "minirt")
        drop.update(id(c) for c in chain)
        new[id(chain[-1])] = node
        parts = [mm.op] + [c.op for c in chain[1:]]
        graph.note(mm.name, f"fused {' + '.join(parts)} into one Linear")
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
    graph.remove_unused()
    return graph


def _gemm_weights(node, graph):
    """(W [K, N], bias [N] or "") of a Gemm that is a linear layer, as new constants, or None."""
    b = graph.tensor(node.inputs[1])
    x = graph.tensor(node.inputs[0])
    c = graph.tensor(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if attr(node, "transA", 0) or not b.is_const or b.data.ndim != 2 or x.shape is None or len(x.shape) != 2:
        return None
    w = np.asarray(b.data, np.float32)
    w = float(attr(node, "alpha", 1.0)) * (w.T if attr(node, "transB", 0) else w)
    n = w.shape[1]
    beta = float(attr(node, "beta", 1.0))
    if c is not None and beta != 0 and (not c.is_const or c.data.size not in (1, n) or c.data.shape[-1:] not in
                                        ((1,), (n,)) or c.data.ndim > 2 or (c.data.ndim == 2 and c.data.shape[0] != 1)):
        return None
    wname = graph.const(graph.fresh_name(f"{node.inputs[1]}@kn"), np.ascontiguousarray(w)).name
    if c is None or beta == 0:
        return wname, ""
    bias = beta * np.broadcast_to(np.asarray(c.data, np.float32).reshape(-1), (n,))
    return wname, graph.const(graph.fresh_name(f"{node.name}.bias"), np.ascontiguousarray(bias)).name
