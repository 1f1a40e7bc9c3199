"""Recognise GELU written out as arithmetic (what exporters emit before opset 20):
    x * 0.5 * (1 + erf(x / sqrt(2)))   in any order of its Mul operands, with Div(x, sqrt 2) or
    Mul(x, 1/sqrt 2) -> one Gelu node, which later passes can fuse into the producer's epilogue."""
from __future__ import annotations

import math

from ..graph import Node


def _const(graph, name, value, tol=1e-6):
    t = graph.tensors.get(name)
    return t is not None and t.is_const and t.data.size == 1 and abs(float(t.data.reshape(-1)[0]) - value) < tol


def _other(node, name):
    a, b = node.inputs
    return b if a == name else a if b == name else None


def rewrite(graph, options, profile=None):
    prod, cons = graph.producers(), graph.consumers()
    drop, new = set(), {}

    def only(name, op):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and c[0].op == op and name not in graph.outputs else None

    for erf in graph.nodes:
        if erf.op != "Erf":
            continue
        scale = prod.get(erf.inputs[0])
        if scale is None or not ((scale.op == "Div" and _const(graph, scale.inputs[1], math.sqrt(2)))
                                 or (scale.op == "Mul" and any(_const(graph, i, 1 / math.sqrt(2))
                                                               for i in scale.inputs))):
            continue
        x = scale.inputs[0] if scale.op == "Div" or not _const(graph, scale.inputs[0], 1 / math.sqrt(2)) \
            else scale.inputs[1]
        add = only(erf.outputs[0], "Add")
        if add is None or not _const(graph, _other(add, erf.outputs[0]), 1.0):
            continue
        m1 = only(add.outputs[0], "Mul")
        if m1 is None:
            continue
        o1 = _other(m1, add.outputs[0])
        if o1 == x:                      # x * (1 + erf) then * 0.5
            m2 = only(m1.outputs[0], "Mul")
            if m2 is None or not _const(graph, _other(m2, m1.outputs[0]), 0.5):
                continue
            chain, out = [scale, erf, add, m1, m2], m2.outputs[0]
        else:                            # (x * 0.5) * (1 + erf)
            half = prod.get(o1)
            if half is None or half.op != "Mul" or x not in half.inputs or not _const(graph, _other(half, x), 0.5) \
                    or len(cons.get(o1, [])) != 1:
                continue
            chain, out = [scale, erf, add, half, m1], m1.outputs[0]
        if len(cons.get(scale.outputs[0], [])) != 1:
            continue
        drop.update(id(n) for n in chain)
        new[id(chain[-1])] = Node("Gelu", erf.name.replace("Erf", "Gelu") or f"{out}.gelu", [x], [out],
                                  {"approximate": "none"})
        graph.note(new[id(chain[-1])].name, "fused the Erf GELU pattern into one Gelu")
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
    graph.remove_unused()
    return graph
