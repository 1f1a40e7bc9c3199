"""conv_channels_last: CNN activations stay channels-last (NHWC) between the convs that run on the buffer GEMM, so a
1x1 conv is a Linear over pixels and a batch is more GEMM rows; Transposes only where a tensor meets an op that needs
NCHW (or the graph's edges).

The buffer GEMM (glsl/linear.comp, the tensor-core kernels, linear_rows for few rows) reads A as rows of K contiguous
values. A channels-last activation [N, H, W, C] is such a matrix: N * H * W rows of C. So a 1x1, stride-1, unpadded
conv (route "linear") is that GEMM on the activation itself, writing [N * H * W, C_out] rows: the next NHWC tensor.
An im2col conv reads NHWC (a tap's C channels are contiguous) or NCHW, and writes either (GEMM rows, or its NCHW
epilogue). Elementwise ops (Relu, Add, Clip, ... whose inputs all have the output's shape, or are scalar constants)
compute the same in either layout, and a global pooling of a channels-last tensor is a reduction over its axes 1 and 2
(whose [N, 1, 1, C] is the pooling's [N, C, 1, 1], a free view). Everything else (max and average pooling, depthwise
and direct convs, reshapes, graph outputs) reads and writes NCHW.

Layouts are chosen per cluster: the 4-D tensors joined through elementwise ops (a residual chain of ResNet blocks is
one cluster). A cluster goes channels-last when that needs fewer Transposes than NCHW does, counting
  NHWC: one Transpose in per tensor made by an NCHW-only op (or a graph input), one out per tensor that an NCHW-only
        op (or the graph's output) reads;
  NCHW: one Transpose per tensor that a "linear" conv reads, and one out of a "linear" conv of a batch that cannot
        write NCHW image by image (offsets the device cannot bind; conv routing sends such a batch of another conv to
        the direct kernel);
ties go channels-last where a "linear" conv reads the cluster or where neither layout needs a Transpose (an im2col
conv then gathers whole channel runs).
ResNet-50: the stem writes NCHW for the MaxPool, one Transpose after the pool, every later conv channels-last, and the
GlobalAveragePool a ReduceMean over the last block's channels-last output.

Result: a channels-last tensor '<name>@nhwc' of shape [N, H, W, C] beside (or instead of) the NCHW one; convs get
attrs["_in_layout"] / ["_out_layout"] = "NHWC" (Conv.infer, reference and lower follow them); Transpose nodes with
perm (0, 2, 3, 1) or (0, 3, 1, 2) at the boundaries (a Reshape, a free view, where C or H x W is 1). Then a
channels-last conv read only by an Add of another channels-last tensor takes it as its GEMM's residual, and the
activation after the Add as its epilogue's, applied after the residual (ResNet's relu(conv + skip): the Add and the
Relu dispatches go). Buffer storage on the buffer GEMM only: textures keep every tensor NCHW (channels-packed
texels), and their convs the routes they had. Session option conv_channels_last=False turns the pass off (and conv
routing then sends 1x1 convs to the pointwise GEMM)."""
from __future__ import annotations

import numpy as np

from ..graph import Node, Tensor
from ..kernels import RES_FIRST, activation_of
from ..kernels.gemm import fast_gemm

OPTION = "conv_channels_last"     # the option that switches this pass off (minirt/planner/__init__.py runs it)

NHWC = "NHWC"
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
GEMM_ROUTES = ("linear", "im2col")
# global pooling of a channels-last tensor: a reduction over its axes 1 and 2, whose [N, 1, 1, C] is [N, C, 1, 1]
GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
# ops that compute elementwise whatever the layout, where every input has the output's shape or is a scalar constant
ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Pow", "Relu", "Sigmoid", "Tanh", "Neg", "Exp", "Abs", "Log", "Sqrt", "Erf",
               "Gelu", "Reciprocal", "HardSigmoid", "HardSwish", "Clip", "QuantizeDequantize")


def rewrite(graph, options, profile=None):
    if not fast_gemm(options.planned_storage, options):
        return graph
    align = profile.min_storage_buffer_offset_alignment if profile is not None else 16
    convs = {id(n): n for n in graph.nodes if _candidate(n, graph)}
    if not convs:
        return graph
    flex = {id(n): n for n in graph.nodes if _elementwise(n, graph)}
    cluster = _clusters(graph, convs, flex)
    prod, cons = graph.producers(), graph.consumers()

    def nhwc_reader(node, t):      # reads t channels-last if t is
        return id(node) in flex or (id(node) in convs and node.inputs[0] == t) or node.op in GLOBAL_POOLS

    def nhwc_writer(t):
        p = prod.get(t)
        return p is not None and (id(p) in flex or id(p) in convs)

    def needs_nhwc(node, t):       # a "linear" conv reads only channels-last
        return id(node) in convs and node.attrs["_route"] == "linear" and node.inputs[0] == t

    def nchw_refused(t):           # a conv of a batch that cannot write NCHW image by image (views of its images)
        from .conv_routing import _batch_refusal
        p = prod.get(t)
        return p is not None and id(p) in convs and _batch_refusal(p, graph, "buffer", align) is not None

    members: dict[str, list[str]] = {}
    for t, root in cluster.items():
        members.setdefault(root, []).append(t)
    nhwc = set()
    for root, ts in members.items():
        if not any(any(id(c) in convs for c in cons.get(t, ())) or (t in prod and id(prod[t]) in convs) for t in ts):
            continue
        cost_nhwc = sum((not nhwc_writer(t)) + (nhwc_writer(t) and _nchw_read(t, graph, cons, nhwc_reader))
                        for t in ts)
        linear_in = sum(any(needs_nhwc(c, t) for c in cons.get(t, ())) for t in ts)
        cost_nchw = linear_in + sum(nchw_refused(t) for t in ts)
        if cost_nhwc < cost_nchw or (cost_nhwc == cost_nchw and (linear_in or not cost_nhwc)):
            nhwc.update(ts)
    _apply(graph, convs, nhwc, prod, cons, nhwc_reader, nhwc_writer, nchw_refused)
    _fold_residuals(graph, convs)
    return graph


def _candidate(node, graph) -> bool:
    """A conv on a GEMM route, 2-D over static shapes, not already laid out by conv_output_nlc / conv_input_nlc."""
    if node.op != "Conv" or node.attrs.get("_route") not in GEMM_ROUTES:
        return False
    if "_in_layout" in node.attrs or "_out_layout" in node.attrs or len(node.inputs) > 3:
        return False
    x, y = graph.tensor(node.inputs[0]), graph.tensor(node.outputs[0])
    return x.is_static and y.is_static and len(x.shape) == 4 and len(y.shape) == 4


def _elementwise(node, graph) -> bool:
    if node.op not in ELEMENTWISE or len(node.outputs) != 1:
        return False
    y = graph.tensor(node.outputs[0])
    if not y.is_static or len(y.shape) != 4:
        return False
    runtime = 0
    for i in node.inputs:
        if not i:
            continue
        t = graph.tensor(i)
        if t.is_const:
            if t.data.size != 1:
                return False
        elif t.shape != y.shape:
            return False
        else:
            runtime += 1
    return runtime > 0


def _clusters(graph, convs, flex) -> dict[str, str]:
    """tensor -> its cluster's root: the runtime 4-D tensors convs read or write, joined through elementwise ops."""
    parent: dict[str, str] = {}

    def find(t):
        parent.setdefault(t, t)
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    for n in convs.values():
        find(n.inputs[0])
        find(n.outputs[0])
    for n in flex.values():
        ins = [i for i in n.inputs if i and not graph.tensor(i).is_const]
        for i in ins:
            parent[find(i)] = find(n.outputs[0])
    return {t: find(t) for t in list(parent)}


def _nchw_read(t, graph, cons, nhwc_reader) -> bool:
    return t in graph.outputs or any(not nhwc_reader(c, t) for c in cons.get(t, ()))


def _apply(graph, convs, nhwc, prod, cons, nhwc_reader, nhwc_writer, nchw_refused):
    """Make the channels-last tensors, point their readers and writers at them, insert the Transposes."""
    after: dict[int, list[Node]] = {}     # node id -> Transposes to insert after it (0: at the start)
    renamed: dict[str, str] = {}

    def nhwc_name(t):
        if t not in renamed:
            n, c, h, w = graph.tensor(t).shape
            renamed[t] = graph.fresh_name(f"{t}@nhwc")
            graph.add_tensor(Tensor(renamed[t], (n, h, w, c), graph.tensor(t).dtype))
        return renamed[t]

    def transpose(src, dst, perm, where):
        n, c, h, w = graph.tensor(src if perm == TO_NHWC else dst).shape
        if c == 1 or h * w == 1:    # the same order in memory (a squeeze-and-excitation's [N, C, 1, 1]): a free view
            shape = graph.const(graph.fresh_name(f"{dst}.shape"), np.array(graph.tensor(dst).shape, np.int64))
            node = Node("Reshape", graph.fresh_name(f"{dst}/reshape"), [src, shape.name], [dst])
        else:
            node = Node("Transpose", graph.fresh_name(f"{dst}/transpose"), [src], [dst], {"perm": list(perm)})
        after.setdefault(where, []).append(node)
        graph.note(node.name, f"channels-last boundary: {'NCHW -> NHWC' if perm == TO_NHWC else 'NHWC -> NCHW'} "
                              f"({graph.tensor(src).shape} -> {graph.tensor(dst).shape})")

    for t in sorted(nhwc):
        p = prod.get(t)
        readers = cons.get(t, [])
        t4 = nhwc_name(t)
        if nhwc_writer(t):
            p.outputs[p.outputs.index(t)] = t4
            if id(p) in convs:
                p.attrs["_out_layout"] = NHWC
            if t in graph.outputs or any(not nhwc_reader(c, t) for c in readers):
                transpose(t4, t, TO_NCHW, id(p))
            else:
                del graph.tensors[t]
        else:     # a graph input or an NCHW-only op's output
            transpose(t, t4, TO_NHWC, id(p) if p is not None else 0)
        for c in readers:
            if nhwc_reader(c, t):
                c.inputs = [t4 if i == t else i for i in c.inputs]
            if c.op in GLOBAL_POOLS:
                _pool_as_reduce(graph, c, after)
    # outside the channels-last clusters: the "linear" convs' inputs, and outputs they cannot write NCHW
    for n in convs.values():
        x, y = n.inputs[0], n.outputs[0]
        if n.attrs["_route"] == "linear" and x not in nhwc and x not in renamed.values():
            if x not in renamed:
                transpose(x, nhwc_name(x), TO_NHWC, id(prod[x]) if x in prod else 0)
            n.inputs[0] = renamed[x]
        if y not in nhwc and y not in renamed and y not in renamed.values() and nchw_refused(y):
            n.outputs[0] = nhwc_name(y)
            n.attrs["_out_layout"] = NHWC
            transpose(renamed[y], y, TO_NCHW, id(n))
    made = set(renamed.values())
    for n in convs.values():
        if n.inputs[0] in made:
            n.attrs["_in_layout"] = NHWC
        what = ["a Linear over pixels"] if n.attrs["_route"] == "linear" else []
        batch = graph.tensor(n.outputs[0]).shape[0]
        if n.attrs.get("_out_layout") == NHWC and batch > 1:
            what.append(f"the batch's {batch} images as GEMM rows")
        graph.note(n.name, f"layout: reads {n.attrs.get('_in_layout', 'NCHW')}, writes "
                           f"{n.attrs.get('_out_layout', 'NCHW')}" + (f" ({'; '.join(what)})" if what else ""))
    nodes = list(after.get(0, []))
    for node in graph.nodes:
        nodes.append(node)
        nodes.extend(after.get(id(node), []))
    graph.nodes = nodes


def _pool_as_reduce(graph, node, after):
    """A global pooling node reading a channels-last tensor becomes a reduction over its axes 1 and 2, then a Reshape
    (a free view) of its [N, 1, 1, C] to the pooling's [N, C, 1, 1]."""
    y = node.outputs[0]
    n, c, _h, _w = graph.tensor(y).shape
    y4 = graph.add_tensor(Tensor(graph.fresh_name(f"{y}@nhwc"), (n, 1, 1, c), graph.tensor(y).dtype)).name
    graph.note(node.name, f"{node.op} of a channels-last input: {GLOBAL_POOLS[node.op]} over axes 1, 2, then a "
                          f"Reshape to {[n, c, 1, 1]}")
    node.op, node.attrs, node.outputs[0] = GLOBAL_POOLS[node.op], {"axes": [1, 2], "keepdims": 1}, y4
    shape = graph.const(graph.fresh_name(f"{y}.shape"), np.array((n, c, 1, 1), np.int64))
    after.setdefault(id(node), []).append(Node("Reshape", graph.fresh_name(f"{y}/reshape"), [y4, shape.name], [y]))


def _fold_residuals(graph, convs):
    """A channels-last conv whose output only an Add of another channels-last tensor of its shape reads takes that
    tensor as its GEMM's residual, and the activation op after the Add (where the conv has none of its own) as its
    epilogue's activation after the residual ("res+relu": a ResNet block's relu(conv + skip)). The conv takes the
    place of the last node it absorbs, where the residual exists."""
    cons = graph.consumers()

    def sole(name):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and name not in graph.outputs else None

    replace, drop, taken = {}, set(), set()
    for conv in convs.values():
        y = conv.outputs[0]
        add = sole(y)
        if conv.attrs.get("_out_layout") != NHWC or len(conv.inputs) > 3 or add is None or add.op != "Add" \
                or id(add) in taken:
            continue
        other = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
        r = graph.tensor(other)
        if other == y or r.is_const or r.shape != graph.tensor(y).shape:
            continue
        last, out = add, add.outputs[0]
        nxt = sole(out)
        act = activation_of(nxt.op, nxt.attrs) if nxt is not None and not conv.attrs.get("_act") else None
        if act:
            conv.attrs["_act"] = RES_FIRST + act
            last, out = nxt, nxt.outputs[0]
            del graph.tensors[add.outputs[0]]
            drop.add(id(add))
        del graph.tensors[y]
        conv.inputs = (list(conv.inputs) + [""] * 3)[:3] + [other]
        conv.outputs[0] = out
        drop.add(id(conv))
        taken.add(id(add))
        replace[id(last)] = conv
        graph.note(conv.name, f"folded Add '{add.name}' into the GEMM epilogue as the residual '{other}'"
                              + (f", then {nxt.op} '{nxt.name}' after it" if act else ""))
    if drop:
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
