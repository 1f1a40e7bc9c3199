"""Fuse a linear layer into one Linear node: MatMul(x, W) with W a 2-D constant, then optionally, each
only when the previous result has no other reader: Add of a constant bias over the last dim, Mul by
a scalar constant (attention's q scaling: folded into W and b), Gelu or Relu, and Add of a runtime
tensor of the same shape (the residual). One GEMM dispatch then does it all in its epilogue."""
from __future__ import annotations

import numpy as np

from ..graph import Node
from ..kernels import activation_of


def rewrite(graph, options, profile=None):
    if not options.pass_on("fuse_linear"):
        return graph
    cons = graph.consumers()
    drop, new = set(), {}

    def sole(name):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and name not in graph.outputs else None

    def other(node, name):
        a, b = node.inputs
        return b if a == name else a

    for mm in graph.nodes:
        if mm.op != "MatMul" or id(mm) in drop:
            continue
        w = graph.tensor(mm.inputs[1])
        x = graph.tensor(mm.inputs[0])
        if not w.is_const or w.data.ndim != 2 or x.shape is None or not 2 <= len(x.shape) <= 4:
            continue
        n = w.data.shape[1]
        chain, cur = [mm], mm.outputs[0]
        bias, scale, act, res = "", 1.0, "", ""
        nxt = sole(cur)
        if nxt is not None and nxt.op == "Add":
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
        node = Node("Linear", mm.name, [mm.inputs[0], mm.inputs[1], bias, res], [cur],
                    {"act": act, "scale": scale}, "minirt")
        drop.update(id(c) for c in chain)
        new[id(chain[-1])] = node
        parts = ["MatMul"] + [c.op for c in chain[1:]]
        graph.note(mm.name, f"fused {' + '.join(parts)} into one Linear")
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
    graph.remove_unused()
    return graph
