"""Recognise GELU written out as arithmetic (what exporters emit before opset 20):
    x * 0.5 * (1 + erf(x / sqrt(2)))   in any order of its Mul operands, with Div(x, sqrt 2) or
    Mul(x, 1/sqrt 2) -> one Gelu node; and its tanh approximation (GPT-2's "gelu_new", transformers'
    NewGELUActivation)
    x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))   with x^3 as Pow(x, 3) -> one Gelu(approximate="tanh").
Later passes can fuse the Gelu into the producer's epilogue."""
from __future__ import annotations

import math

from ..graph import Node


def _const(graph, name, value, tol=1e-6):
    t = graph.tensors.get(name)
    return t is not None and t.is_const and t.data.size == 1 and abs(float(t.data.reshape(-1)[0]) - value) < tol


def _other(node, name):
    a, b = node.inputs
    return b if a == name else a if b == name else None


def _halved_product(graph, prod, cons, only, x, act):
    """The nodes that make x * 0.5 * act (either order of the Muls) from the activation term `act` = 1 + f(x), and
    the result: ([Mul nodes], out) or None."""
    m1 = only(act, "Mul")
    if m1 is None:
        return None
    o1 = _other(m1, act)
    if o1 == x:                      # x * (1 + f) then * 0.5
        m2 = only(m1.outputs[0], "Mul")
        if m2 is None or not _const(graph, _other(m2, m1.outputs[0]), 0.5):
            return None
        return [m1, m2], m2.outputs[0]
    half = prod.get(o1)                # (x * 0.5) * (1 + f)
    if half is None or half.op != "Mul" or x not in half.inputs or not _const(graph, _other(half, x), 0.5) \
            or len(cons.get(o1, [])) != 1:
        return None
    return [half, m1], m1.outputs[0]


def _tanh_gelu(graph, prod, cons, only, tanh):
    """(x, nodes, out) of the tanh GELU around this Tanh, or None."""
    scale = prod.get(tanh.inputs[0])
    if scale is None or scale.op != "Mul" or not any(_const(graph, i, math.sqrt(2 / math.pi)) for i in scale.inputs):
        return None
    inner = prod.get(_other(scale, next(i for i in scale.inputs if _const(graph, i, math.sqrt(2 / math.pi)))))
    if inner is None or inner.op != "Add":
        return None
    for cubic_out in inner.inputs:
        x = _other(inner, cubic_out)
        cubic = prod.get(cubic_out)
        if cubic is None or cubic.op != "Mul" or not any(_const(graph, i, 0.044715) for i in cubic.inputs):
            continue
        pw = prod.get(_other(cubic, next(i for i in cubic.inputs if _const(graph, i, 0.044715))))
        if pw is not None and pw.op == "Pow" and pw.inputs[0] == x and _const(graph, pw.inputs[1], 3.0):
            break
    else:
        return None
    add = only(tanh.outputs[0], "Add")
    if add is None or not _const(graph, _other(add, tanh.outputs[0]), 1.0):
        return None
    tail = _halved_product(graph, prod, cons, only, x, add.outputs[0])
    if tail is None:
        return None
    inside = [pw, cubic, inner, scale]
    if any(len(cons.get(n.outputs[0], [])) != 1 or n.outputs[0] in graph.outputs for n in inside):
        return None
    return x, [*inside, tanh, add, *tail[0]], tail[1]


def rewrite(graph, options, profile=None):
    prod, cons = graph.producers(), graph.consumers()
    drop, new = set(), {}

    def only(name, op):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and c[0].op == op and name not in graph.outputs else None

    for tanh in graph.nodes:
        if tanh.op != "Tanh":
            continue
        found = _tanh_gelu(graph, prod, cons, only, tanh)
        if found is None or any(id(n) in drop for n in found[1]):
            continue
        x, chain, out = found
        drop.update(id(n) for n in chain)
        new[id(chain[-1])] = Node("Gelu", tanh.name.replace("Tanh", "Gelu") or f"{out}.gelu", [x], [out],
                                  {"approximate": "tanh"})
        graph.note(new[id(chain[-1])].name, "fused the tanh GELU pattern into one Gelu(approximate=tanh)")

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
        tail = _halved_product(graph, prod, cons, only, x, add.outputs[0])
        if tail is None:
            continue
        chain, out = [scale, erf, add, *tail[0]], tail[1]
        if len(cons.get(scale.outputs[0], [])) != 1:
            continue
        drop.update(id(n) for n in chain)
        new[id(chain[-1])] = Node("Gelu", erf.name.replace("Erf", "Gelu") or f"{out}.gelu", [x], [out],
                                  {"approximate": "none"})
        graph.note(new[id(chain[-1])].name, "fused the Erf GELU pattern into one Gelu")
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop or id(n) in new]
    graph.remove_unused()
    return graph
