"""Recognise SiLU (Swish) as exporters write it, Mul(x, Sigmoid(x)) in either operand order with the Sigmoid read
by that Mul alone, and make it one Silu node, which fuse_activation and fuse_linear then take into the producer's
epilogue (a conv's or a Linear's): EfficientNet's and a Conformer's activations cost no dispatch of their own. A
gate, Mul(y, Sigmoid(x)) with y another tensor (squeeze-and-excitation, GLU), stays as it is."""
from __future__ import annotations

from ..graph import Node

OPTION = "fuse_silu"     # the option that switches this pass off (minirt/planner/__init__.py runs it)


def rewrite(graph, options, profile=None):
    prod, cons = graph.producers(), graph.consumers()
    drop, new = set(), {}
    for mul in graph.nodes:
        if mul.op != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
            continue
        for gate, x in (mul.inputs, mul.inputs[::-1]):
            sig = prod.get(gate)
            if (sig is not None and sig.op == "Sigmoid" and sig.domain in ("", "ai.onnx") and sig.inputs[0] == x
                    and len(cons.get(gate, [])) == 1 and gate not in graph.outputs
                    and graph.tensors[x].shape == graph.tensors[mul.outputs[0]].shape):
                drop.add(id(sig))
                new[id(mul)] = Node("Silu", mul.name, [x], list(mul.outputs), {}, "minirt")
                graph.note(mul.name, f"fused Sigmoid '{sig.name}' and this Mul into one Silu")
                break
    graph.nodes = [new.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return graph
