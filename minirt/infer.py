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
MAX_FOLD_ELEMENTS = 1 << 28   # a constant made at load (ConstantOfShape, Range, Expand, ...) is host memory


def bind_inputs(graph: Graph, shapes: dict) -> Graph:
    """A copy of the graph whose inputs have the given concrete shapes."""
    g = graph.copy()
    for name, shape in shapes.items():
        t = g.tensors.get(name)
        if t is None or name not in g.inputs:
            raise InputError(f"'{name}' is not an input of {g.source} (inputs: {', '.join(g.inputs)})")
        declared = t.shape
        shape = tuple(int(d) for d in shape)
        if 0 in shape:
            raise InputError(f"input '{name}' of {g.source} has shape {list(shape)}, with no elements; minirt does "
                             f"not run empty tensors")
        if declared is not None:
            ok = len(declared) == len(shape) and all(not isinstance(d, int) or d == s for d, s in zip(declared, shape))
            if not ok:
                raise InputError(f"input '{name}' of {g.source} expects shape {list(declared)}, got {list(shape)}")
        t.shape = shape
    # symbolic dims bound through one input are the same wherever else they appear
    return g


def prepare(graph: Graph) -> Graph:
    """Fold and infer in place; raise for anything that cannot run. Returns the graph."""
    # An ONNX-domain node named like one of minirt's internal ops (domain 'minirt': Linear, Attention,
    # made by planner passes with their own attributes and layouts) is not that op: ONNX's Attention
    # (opset 23) would otherwise run on minirt's kernel with other semantics and give wrong results.
    clash = [n for n in graph.nodes if n.domain in ("", "ai.onnx") and n.op in ops.OPS
             and ops.OPS[n.op].domain not in ("", "ai.onnx")]
    if clash:
        lines = [f"  {n.op} (domain 'ai.onnx') in node '{n.name}'" for n in clash]
        kinds = sorted({n.op for n in clash})
        raise UnsupportedError(f"{graph.source}: {len(clash)} node(s) use ONNX ops minirt does not support "
                               f"({', '.join(kinds)}; minirt's own ops of that name are internal, domain "
                               f"'minirt'):\n" + "\n".join(lines), clash)
    ops.require_supported(graph)
    graph.toposort()
    for name in graph.inputs:
        t = graph.tensors.get(name)
        if t is not None and t.is_static and _numel(t.shape) > MAX_ELEMENTS:
            raise ModelError(f"{graph.source}: input '{name}' declares shape {list(t.shape)}, more than "
                             f"{MAX_ELEMENTS} elements; refused")
        if t is not None and t.shape is not None and 0 in t.shape:
            raise UnsupportedError(f"{graph.source}: input '{name}' declares shape {list(t.shape)}, with no "
                                   f"elements; minirt does not run empty tensors", [name])
    kept, problems = [], []
    unknown = set()    # outputs of nodes that cannot run: what reads them is not inferred (it would fail on them)
    for node in graph.nodes:
        op = ops.get(node.op, node.domain)
        ins = [graph.tensor(i) if i else None for i in node.inputs]
        # downstream of a node that cannot run, shapes are unknown: such a node is checked (so every
        # problem is listed at once) but neither folded nor inferred (that would fail on the unknowns)
        blocked = bool(unknown.intersection(node.inputs))
        if not blocked:
            n = _fold_size(op, node, ins)
            if n is not None and n > MAX_FOLD_ELEMENTS:
                raise ModelError(f"{graph.source}: {node} would make a constant of {n:.0f} elements at load time, "
                                 f"more than {MAX_FOLD_ELEMENTS}; refused before allocating it")
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
            unknown.update(o for o in node.outputs if o)
            continue
        try:
            reason = op.check(node, ins)
        except Exception:
            if not blocked:
                raise
            reason = None
        if reason:
            problems.append(f"  {node.op} node '{node.name}': {reason}")
            unknown.update(o for o in node.outputs if o)
            continue
        if blocked:
            unknown.update(o for o in node.outputs if o)
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
            if t.is_static and 0 in t.shape:
                raise UnsupportedError(f"{graph.source}: tensor '{name}' from {node} would have shape "
                                       f"{list(t.shape)}, with no elements; minirt does not run empty tensors",
                                       [name])
        kept.append(node)
    if problems:
        raise UnsupportedError(f"{graph.source}: {len(problems)} node(s) cannot run:\n" + "\n".join(problems), problems)
    graph.nodes = kept
    graph.remove_unused()
    consts = [o for o in graph.outputs if o in graph.tensors and graph.tensors[o].is_const]
    if consts:
        raise UnsupportedError(f"{graph.source}: graph output(s) {', '.join(repr(o) for o in consts)} are constants "
                               f"(known at load time, from initializers alone); minirt needs every output to be "
                               f"computed from a graph input", consts)
    return graph


def _numel(shape) -> float:
    return float(np.prod([float(d) for d in shape])) if len(shape) else 1.0


def _fold_size(op, node, ins):
    """Elements the fold of this node would produce, when that can be told without evaluating it (its
    inputs all constants); None otherwise. Keeps an absurd ConstantOfShape, Range or broadcast from
    allocating host memory before it is refused."""
    if not all(t is None or t.is_const for t in ins):
        return None
    try:
        if node.op == "ConstantOfShape":
            return _numel(np.asarray(ins[0].data).reshape(-1).tolist())
        if node.op == "Range":
            start, limit, delta = (float(np.asarray(t.data).reshape(-1)[0]) for t in ins[:3])
            return max(np.ceil((limit - start) / delta), 0.0) if delta else None
        if op.gpu:
            shapes = [shape for shape, _ in op.infer(node, ins) if shape is not None]
            return max((_numel(sh) for sh in shapes if all(isinstance(d, int) for d in sh)), default=None)
    except Exception:       # the fold itself reports what is wrong with the node
        return None
    return None
