"""Shape and dtype inference, with constant folding, over a Graph.

Any node whose outputs are known at load time (all inputs constant, or a Shape of a static
tensor) is evaluated with its numpy reference and replaced by constants; this is what turns an
exporter's Shape/Gather/Concat/Unsqueeze arithmetic into static reshapes."""
from __future__ import annotations

import numpy as np

from . import ops
from .errors import InputError, ModelError, UnsupportedError
from .graph import Graph

MAX_ELEMENTS = 1 << 31   # refuse absurd declared shapes before anything is allocated


def bind_inputs(graph: Graph, shapes: dict) -> Graph:
    """A copy of the graph whose inputs have the given concrete shapes."""
    g = graph.copy()
    for name, shape in shapes.items():
        t = g.tensors.get(name)
        if t is None or name not in g.inputs:
            raise InputError(f"'{name}' is not an input of {g.source} (inputs: {', '.join(g.inputs)})")
        declared = t.shape
        shape = tuple(int(d) for d in shape)
        if declared is not None:
            ok = len(declared) == len(shape) and all(not isinstance(d, int) or d == s for d, s in zip(declared, shape))
            if not ok:
                raise InputError(f"input '{name}' of {g.source} expects shape {list(declared)}, got {list(shape)}")
        t.shape = shape
    # symbolic dims bound through one input are the same wherever else they appear
    return g


def prepare(graph: Graph) -> Graph:
    """Fold and infer in place; raise for anything that cannot run. Returns the graph."""
    ops.require_supported(graph)
    graph.toposort()
    kept, problems = [], []
    for node in graph.nodes:
        op = ops.get(node.op, node.domain)
        ins = [graph.tensor(i) if i else None for i in node.inputs]
        try:
            folded = op.fold(node, ins)
        except (ModelError, UnsupportedError):
            raise
        except Exception as e:
            raise ModelError(f"{graph.source}: {node} failed to evaluate at load time: {e}") from None
        if folded is not None:
            for name, val in zip(node.outputs, folded):
                if name:
                    graph.const(name, np.asarray(val))
            continue
        if not op.gpu:
            problems.append(f"  {node.op} node '{node.name}': its inputs are not known at load time "
                            f"(minirt evaluates {node.op} only as shape arithmetic on constants)")
            continue
        reason = op.check(node, ins)
        if reason:
            problems.append(f"  {node.op} node '{node.name}': {reason}")
            continue
        try:
            outs = op.infer(node, ins)
        except (ModelError, UnsupportedError):
            raise
        except Exception as e:
            raise ModelError(f"{graph.source}: shape inference failed for {node}: {e}") from None
        for name, (shape, dtype) in zip(node.outputs, outs):
            if not name:
                continue
            t = graph.tensors.get(name) or graph.add_tensor(type(ins[0])(name))
            t.shape, t.dtype = (tuple(shape) if shape is not None else None), dtype
            if t.is_static and int(np.prod(t.shape, dtype=np.float64)) > MAX_ELEMENTS:
                raise ModelError(f"{graph.source}: tensor '{name}' from {node} would have shape {list(t.shape)}, "
                                 f"more than {MAX_ELEMENTS} elements")
        kept.append(node)
    if problems:
        raise UnsupportedError(f"{graph.source}: {len(problems)} node(s) cannot run:\n" + "\n".join(problems), problems)
    graph.nodes = kept
    graph.remove_unused()
    return graph
