"""Fuse an activation (Relu, Gelu, HardSwish, Silu: minirt.kernels.activation_of) into the epilogue of the conv that
feeds it, also across the Reshape the conv1d rewrite inserts (activations are elementwise, so they commute with reshapes).
Only convs whose route has an epilogue (linear, im2col, pointwise, depthwise) take it; the output of the
conv must have no other reader."""
from __future__ import annotations

from ..kernels import activation_of

EPILOGUE_ROUTES = ("linear", "im2col", "pointwise", "depthwise")


def rewrite(graph, options, profile=None):
    cons = graph.consumers()
    drop = set()

    def sole(name):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and name not in graph.outputs else None

    for node in graph.nodes:
        if node.op != "Conv" or node.attrs.get("_route") not in EPILOGUE_ROUTES or "_act" in node.attrs:
            continue
        nxt = sole(node.outputs[0])
        via = None
        if nxt is not None and nxt.op == "Reshape":
            via, nxt = nxt, sole(nxt.outputs[0])
        act = activation_of(nxt.op, nxt.attrs) if nxt is not None else None
        if act is None:
            continue
        node.attrs["_act"] = act
        # the activation's output is now produced by the conv (or by the reshape after it)
        last = via or node
        graph.tensors[nxt.outputs[0]].shape = graph.tensors[last.outputs[0]].shape
        old = last.outputs[0]
        last.outputs[0] = nxt.outputs[0]
        drop.add(id(nxt))
        del graph.tensors[old]      # only the activation read it
        graph.note(node.name, f"fused {nxt.op} '{nxt.name}' into the conv's epilogue")
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    return graph
