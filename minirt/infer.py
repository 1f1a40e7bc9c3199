"""Shape and dtype inference, with constant folding, over a Graph.

Any node whose outputs are known at load time (all inputs constant, or a Shape of a static
tensor) is evaluated with its numpy reference and replaced by constants; this is what turns an
exporter's Shape/Gather/Concat/Unsqueeze arithmetic into static reshapes."""
from __future__ import annotations

import numpy as np

from . import ops
from .errors import InputError, MinirtError, ModelError, UnsupportedError
from .graph import Graph
from .qdq import fold_qdq_pairs
from .rank5 import compact_rank5_transposes, refuse_high_ranks, unstack_rank5

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


def fold_nan_guards(graph: Graph) -> int:
    """Where(IsNaN(x), c, x) with c a constant scalar and the IsNaN read by nothing else becomes one ReplaceNaN(x)
    (value c): the guard exporters put after a masked softmax, run without a boolean tensor. Returns how many."""
    made = {o: n for n in graph.nodes for o in n.outputs}
    readers = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers[i] = readers.get(i, 0) + 1
    done, drop = 0, set()
    for n in graph.nodes:
        if n.op != "Where" or n.domain not in ("", "ai.onnx") or len(n.inputs) != 3:
            continue
        cond, c, x = n.inputs
        guard = made.get(cond)
        t = graph.tensors.get(c)
        if (guard is None or guard.op != "IsNaN" or guard.inputs[:1] != [x] or readers.get(cond) != 1
                or cond in graph.outputs or t is None or not t.is_const or np.asarray(t.data).size != 1):
            continue
        n.op, n.domain, n.inputs = "ReplaceNaN", "minirt", [x]
        n.attrs = {"value": float(np.asarray(t.data).reshape(-1)[0])}
        drop.add(id(guard))
        done += 1
    if drop:
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    return done


def fold_index_casts(graph: Graph) -> int:
    """Cast(to int64) of an int32 graph input read only as the indices of Gather or GatherND (which ONNX types int64
    for GatherND) is dropped: they read the int32 input itself, as minirt keeps run-time integers in int32. Returns
    how many."""
    readers = {}
    for n in graph.nodes:
        for k, i in enumerate(n.inputs):
            readers.setdefault(i, []).append((n, k))
    drop = set()
    for n in graph.nodes:
        src = n.inputs[0] if n.op == "Cast" and n.domain in ("", "ai.onnx") and n.inputs else None
        t = graph.tensors.get(src) if src else None
        if (t is None or src not in graph.inputs or t.dtype != "int32" or n.attrs.get("to") != 7
                or n.outputs[0] in graph.outputs):
            continue
        users = readers.get(n.outputs[0], [])
        if users and all(u.op in ("Gather", "GatherND") and u.domain in ("", "ai.onnx") and k == 1 for u, k in users):
            for u, k in users:
                u.inputs[k] = src
            drop.add(id(n))
    if drop:
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    return len(drop)


def prepare(graph: Graph, *, symbolic: bool = False, host: bool = False, runtime_gather: int = 1 << 62) -> Graph:
    """Fold and infer in place; raise for anything that cannot run. Returns the graph.

    host=True runs what the graph computes from its integer and boolean inputs on the host, each run
    (minirt/host.py): those nodes leave graph.nodes for graph.host (a HostPart), and the graph's inputs become the
    float32 inputs and the host values the GPU reads. runtime_gather: the largest table (bytes) an embedding
    Gather by host indices reads on the GPU (buffer storage: the device's maxStorageBufferRange), 0 for none (textures);
    a larger table is gathered on the host.

    Constants made by folding count against graph.load_limit (minirt.graph.MAX_LOAD_BYTES unless the
    loader was given max_load_bytes), each checked from its inferred shape before it is allocated.

    symbolic=True checks a graph whose inputs keep their symbolic dims for what is wrong at every size:
    shape arithmetic that only folds once a run binds real shapes (and what reads its results) is left
    for then instead of being reported."""
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
    fold_nan_guards(graph)
    fold_index_casts(graph)
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
    pending = set()    # symbolic: outputs known only once a run binds real shapes
    split = None
    if host:
        from .host import HostSplit
        split = HostSplit(graph, runtime_gather)
        readers = graph.consumers()
        for name in graph.inputs:
            t = graph.tensors.get(name)
            # float32 inputs too where only ops that run on the host alone read them (IsNaN, Where, CumSum, ...)
            host_only = readers.get(name) and not any(ops.get(n.op, n.domain).gpu for n in readers[name])
            if t is not None and (t.dtype not in (None, "float32") or host_only) and not split.add_input(name):
                pending.add(name)
    for node in graph.nodes:
        op = ops.get(node.op, node.domain)
        ins = [graph.tensor(i) if i else None for i in node.inputs]
        if pending.intersection(node.inputs):
            pending.update(o for o in node.outputs if o)
            kept.append(node)
            continue
        # downstream of a node that cannot run, shapes are unknown: such a node is checked (so every
        # problem is listed at once) but neither folded nor inferred (that would fail on the unknowns)
        blocked = bool(unknown.intersection(node.inputs))
        if not blocked and _fold(graph, op, node, ins):
            continue
        if split is not None and not blocked and split.reads_host(node):
            if split.on_host(op, node, ins):
                split.evaluate(op, node, ins)
                continue
            reason = split.connect(op, node, ins) if op.gpu else None    # host-only ops: reported below
            if reason:
                problems.append(f"  {node.op} node '{node.name}': {reason}")
                unknown.update(o for o in node.outputs if o)
                continue
            ins = [graph.tensor(i) if i else None for i in node.inputs]
        if not op.gpu:
            if symbolic:
                pending.update(o for o in node.outputs if o)
                kept.append(node)
                continue
            problems.append(f"  {node.op} node '{node.name}': its inputs are not known at load time "
                            f"(minirt evaluates {node.op} only as shape arithmetic on constants"
                            + (" and on the host, from the model's integer and boolean inputs; it reads a "
                               "tensor computed on the GPU)" if split is not None else ")"))
            unknown.update(o for o in node.outputs if o)
            continue
        try:
            reason = op.check(node, ins)
        except MinirtError:
            if not blocked:
                raise
            reason = None
        except Exception as e:   # an attribute of the wrong kind or value, found by the op's own code
            if not blocked:
                raise ModelError(f"{graph.source}: {node} is malformed ({type(e).__name__}: {e})") from None
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
            # a quantized constant's float value, which the planner folds (fold_dequantize_linear)
            t.planner_const = getattr(op, "planner_folds", False) and all(i is None or i.is_const for i in ins)
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
    if split is not None:
        graph.host = split.finish(graph)
    graph.remove_unused()
    fold_qdq_pairs(graph)   # before the rank-5 rewrites: the pairs quantize_static puts inside their patterns go
    unstack_rank5(graph)    # kernels take rank <= 4: rank-5 tensors exporters make in passing, at rank <= 4
    compact_rank5_transposes(graph)
    refuse_high_ranks(graph)
    consts = [o for o in graph.outputs if o in graph.tensors and graph.tensors[o].is_const]
    if consts:
        raise UnsupportedError(f"{graph.source}: graph output(s) {', '.join(repr(o) for o in consts)} are constants "
                               f"(known at load time, from initializers alone); minirt needs every output to be "
                               f"computed from a graph input", consts)
    return graph


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


def _itemsize(dtype) -> int:
    try:
        return np.dtype(dtype).itemsize if dtype else 8
    except TypeError:
        return 8


# folds that numpy makes as views of their (contiguous) input: nothing new to allocate, so a reshape of
# a weight bigger than the limit still loads (what a fold does allocate is counted after it all the same)
_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"}


def _fold(graph, op, node, ins) -> bool:
    """Replace the node's outputs by constants when they are known at load time; False when they are not.
    What the fold makes is charged to the graph's load limit first, from shapes alone."""
    est = _fold_bytes(graph, op, node, ins)
    if est is None:
        return False
    graph.charge(est, str(node))
    try:
        folded = op.fold(node, ins)
    except MinirtError:
        raise
    except Exception as e:
        raise ModelError(f"{graph.source}: {node} failed to evaluate at load time: {e}") from None
    if folded is None:
        graph.made_bytes -= est
        return False
    vals = [np.asarray(v) for v in folded]
    made = sum(v.nbytes for v in vals if not any(t is not None and t.is_const and np.may_share_memory(v, t.data)
                                                  for t in ins))     # a view of a constant made nothing
    graph.made_bytes -= est
    graph.charge(made, str(node))     # within the estimate, but for a copy where a view was expected
    for name, val in zip(node.outputs, vals):
        if name:
            graph.const(name, val)
    return True


def _fold_bytes(graph, op, node, ins):
    """An upper bound on the bytes the fold of this node would make, from shapes alone (the fold itself
    could be a ConstantOfShape or Expand of billions of elements); None when it does not fold."""
    if type(op).fold is not ops.Op.fold:        # Shape, Size: fold from a static shape, to a few integers
        shape = ins[0].shape if ins and ins[0] is not None else None
        return None if shape is None else 8 * (len(shape) + 1)
    if not all(t is None or t.is_const for t in ins):
        return None
    try:
        if node.op == "ConstantOfShape":
            dtype = getattr(node.attrs.get("value"), "dtype", "float32")
            return _numel(np.asarray(ins[0].data).reshape(-1).tolist()) * _itemsize(dtype)
        if node.op == "Range":
            start, limit, delta = (float(np.asarray(t.data).reshape(-1)[0]) for t in ins[:3])
            n = np.ceil((limit - start) / delta) if delta else np.nan
            if not np.isfinite(n):
                raise ModelError(f"{graph.source}: {node}: Range({start}, {limit}, {delta}) has no finite length")
            return max(int(n), 0) * _itemsize(ins[0].dtype)
        if op.gpu:
            outs = op.infer(node, ins)
            if node.op in _VIEWS:
                return 0
            if all(s is not None and all(isinstance(d, int) for d in s) for s, _ in outs):
                return sum(_numel(s) * _itemsize(dt) for s, dt in outs)
        # elementwise shape arithmetic (Where, Equal, Sum, Mod, ReduceProd, ...): at most the inputs broadcast
        shapes = [t.shape for t in ins if t is not None]
        rank = max((len(s) for s in shapes), default=0)
        dims = [max([s[len(s) - rank + a] for s in shapes if len(s) - rank + a >= 0], default=1)
                for a in range(rank)]
        return _numel(dims) * max([_itemsize(t.dtype) for t in ins if t is not None], default=8)
    except MinirtError:
        raise
    except Exception as e:
        raise ModelError(f"{graph.source}: {node} failed to evaluate at load time: {type(e).__name__}: {e}") \
            from None
