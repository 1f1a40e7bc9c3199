"""Fuse multi-head attention written out as head splits, two MatMuls and a Softmax into one Attention node
(domain minirt, glsl/attention.comp), so the [B, H, T, T] scores never reach memory:

    q [B, T, D] -> Reshape [B, T, H, dh] -> Transpose(0,2,1,3) -> Qh     (k likewise -> Kt [B, H, dh, T],
    Softmax(MatMul(Qh, Kt) [* or / scalar]) -> MatMul(., Vh) -> Transpose(0,2,1,3) -> Reshape [B, T, D]

Exporters spell the head splits differently (K through Transpose(0,2,3,1), or Transpose(0,2,1,3) then
(0,1,3,2), or the dynamo exporter's Reshape [B*H, T, dh] -> Transpose(0,2,1) -> Reshape [B, H, dh, T]; extra
no-op Reshapes; scalar Muls on Qh and Kt), so the chains are not matched node by node: each Reshape-like and
Transpose is applied to a symbolic layout (every axis a list of the atoms B, T, H, dh, outermost first) and
the result must be the layout the MatMuls need. Scalar Mul/Div by constants on Qh, Kt or the scores fold into
`scale`. Every intermediate must be read only inside the pattern and must not be a graph output. Where no
[B, T, D] tensor starts or ends a chain, one that is that but for axes of size 1 does (nn.MultiheadAttention's
[T, 1, D] at batch 1: the same row-major order), through a Reshape into or out of the Attention."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..graph import Node, Tensor

REGROUP = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")   # relabel the shape, keep row-major order
MAX_CHAIN = 8


def _scalar(graph, name):
    t = graph.tensors.get(name)
    return float(t.data.reshape(-1)[0]) if t is not None and t.is_const and t.data.size == 1 else None


def _scale_of(graph, node, x):
    """The factor a Mul/Div node applies to x when the other operand is a scalar constant, else None."""
    if node.op not in ("Mul", "Div") or len(node.inputs) != 2 or graph.tensor(node.outputs[0]).shape != \
            graph.tensor(x).shape:
        return None
    other = node.inputs[1] if node.inputs[0] == x else node.inputs[0] if node.op == "Mul" else None
    c = _scalar(graph, other) if other is not None and other != x else None
    if c is None or (node.op == "Div" and c == 0):
        return None
    return c if node.op == "Mul" else 1 / c


def _apply(graph, node, layout, sizes):
    """The layout of node's output given its input's, or None when the node is not a pure relabelling."""
    if node.op == "Transpose":
        perm = node.attrs.get("perm", list(range(len(layout)))[::-1])
        return [layout[int(p)] for p in perm] if sorted(perm) == list(range(len(layout))) else None
    flat = [a for ax in layout for a in ax]
    out, i = [], 0
    for dim in graph.tensor(node.outputs[0]).shape:
        group, n = [], 1
        while n < dim and i < len(flat):
            group.append(flat[i])
            n *= sizes[flat[i]]
            i += 1
        if n != dim:
            return None     # splits an atom: not a head split we know
        out.append(tuple(group))
    return out if i == len(flat) else None


def _atoms(named, prefix):
    """Layout and sizes of named axes [[(name, size), ..], ..]; size-1 atoms are dropped (they never move data)."""
    sizes = {prefix + a: n for axis in named for a, n in axis if n != 1}
    return [tuple(prefix + a for a, n in axis if n != 1) for axis in named], sizes


def _data_input(graph, node):
    """The input a relabelling or scalar-scaling node passes on, else None."""
    if node.op in REGROUP or node.op == "Transpose":
        return node.inputs[0]
    return next((x for x in node.inputs if _scale_of(graph, node, x) is not None), None)


def _but_units(shape):
    return [d for d in shape if d != 1]


def _walk_up(graph, prod, name, root_shape, want, prefix, root_named):
    """From tensor `name` up through relabelling and scalar nodes to a tensor of root_shape (or of the same shape but
    for axes of size 1 elsewhere, as nn.MultiheadAttention's [T, 1, D] at batch 1: the same row-major order) whose
    layout, carried down the chain, is `want`; the nearest of root_shape itself, else the nearest of the other.
    Returns (root, nodes top-down, scale) or None."""
    chain, cur, other = [], name, None
    while len(chain) < MAX_CHAIN:
        node = prod.get(cur)
        cur = None if node is None else _data_input(graph, node)
        if cur is None:
            return other
        chain.insert(0, node)
        shape = tuple(graph.tensor(cur).shape or ())
        if _but_units(shape) != _but_units(root_shape) or (shape != root_shape and other is not None):
            continue
        layout, sizes = _atoms(root_named, prefix)
        if shape != root_shape:     # the root's atoms on its own axes, in the same order
            atoms = iter([ax for ax in layout if ax])
            layout = [() if d == 1 else next(atoms) for d in shape]
        scale, x = 1.0, cur
        for n in chain:
            if n.op in REGROUP or n.op == "Transpose":
                layout = _apply(graph, n, layout, sizes)
            else:
                scale *= _scale_of(graph, n, x)
            if layout is None:
                break
            x = n.outputs[0]
        if layout == want and shape == root_shape:
            return cur, chain, scale
        if layout == want:
            other = cur, list(chain), scale
    return other


def _match(graph, prod, cons, sm):
    if len(graph.tensor(sm.inputs[0]).shape or ()) != 4 or ops.get("Softmax")._dims(sm, 4) != (3,):
        return None
    after = cons.get(sm.outputs[0], [])
    if len(after) != 1 or after[0].op != "MatMul" or after[0].inputs[0] != sm.outputs[0]:
        return None
    mm2, scores, scale = after[0], [], 1.0
    cur = sm.inputs[0]
    while cur in prod and prod[cur].op in ("Mul", "Div") and len(scores) < MAX_CHAIN:
        node = prod[cur]
        x = _data_input(graph, node)
        if x is None:
            return None
        scale *= _scale_of(graph, node, x)
        scores.insert(0, node)
        cur = x
    mm1 = prod.get(cur)
    if mm1 is None or mm1.op != "MatMul":
        return None
    shapes = [graph.tensor(n).shape for n in (mm1.inputs[0], mm1.inputs[1], mm2.inputs[1])]
    if not all(s is not None and len(s) == 4 and all(isinstance(d, int) for d in s) for s in shapes):
        return None
    (B, H, Tq, dh), (_, _, _, Tk) = shapes[0], shapes[1]
    if shapes[1] != (B, H, dh, Tk) or shapes[2] != (B, H, Tk, dh) or graph.tensor(mm1.inputs[0]).dtype != "float32":
        return None
    def root(T):    # the [B, T, D] inputs, D split into heads
        return [[("B", B)], [("T", T)], [("H", H), ("d", dh)]]

    split = {}
    for key, name, T, order in (("q", mm1.inputs[0], Tq, "BHTd"), ("k", mm1.inputs[1], Tk, "BHdT"),
                                ("v", mm2.inputs[1], Tk, "BHTd")):
        want = [(key + a,) if dict(B=B, H=H, T=T, d=dh)[a] != 1 else () for a in order]
        found = _walk_up(graph, prod, name, (B, T, H * dh), want, key, root(T))
        if found is None or (key == "v" and found[2] != 1.0):
            return None
        split[key] = found
        scale *= found[2]
    # down from the output: relabellings only, to [B, Tq, D] with D = (H, dh)
    layout, sizes = _atoms([[("B", B)], [("H", H)], [("T", Tq)], [("d", dh)]], "o")
    want, _ = _atoms(root(Tq), "o")
    tail, cur, other = [], mm2.outputs[0], None
    # to [B, Tq, D]; else to the last tensor that is that but for axes of size 1 (the Attention's output then is
    # reshaped to it)
    while layout != want or graph.tensor(cur).shape != (B, Tq, H * dh):
        if tail and [a for a in layout if a] == [a for a in want if a] and \
                _but_units(graph.tensor(cur).shape) == _but_units((B, Tq, H * dh)):
            other = list(tail), cur
        nxt = cons.get(cur, [])
        layout = _apply(graph, nxt[0], layout, sizes) if len(tail) < MAX_CHAIN and len(nxt) == 1 and \
            (nxt[0].op in REGROUP or nxt[0].op == "Transpose") else None
        if layout is None:
            if other is None:
                return None
            tail, cur = other
            break
        tail.append(nxt[0])
        cur = nxt[0].outputs[0]
    if not tail:
        return None
    nodes = list({id(n): n for n in [n for k in "qkv" for n in split[k][1]] + [mm1, *scores, sm, mm2, *tail]}
                 .values())
    roots = [split[k][0] for k in "qkv"]
    inner = {o for n in nodes for o in n.outputs if o} - {cur}
    members = {id(n) for n in nodes}
    if any(r in inner for r in roots) or any(o in graph.outputs for o in inner) or \
            any(id(c) not in members for o in inner for c in cons.get(o, [])):
        return None
    shapes = [(B, T, H * dh) for T in (Tq, Tk, Tk)]     # what Attention reads; a root of another shape is reshaped
    return nodes, list(zip(roots, shapes)), cur, H, scale


def rewrite(graph, options, profile=None):
    if not options.pass_on("fuse_attention"):
        return graph
    prod, cons = graph.producers(), graph.consumers()
    drop, new = set(), {}
    names = {n.name for n in graph.nodes}
    for sm in graph.nodes:
        if sm.op != "Softmax" or id(sm) in drop:
            continue
        m = _match(graph, prod, cons, sm)
        if m is None:
            continue
        nodes, roots, out, heads, scale = m
        why = ops.get("Attention", "minirt").head_problem(graph.tensor(out).shape[-1], heads)
        if why or any(id(n) in drop for n in nodes):
            if why:
                graph.note(sm.name, f"attention pattern not fused: {why}")
            continue
        base = sm.name.rsplit("/", 1)[0] + "/Attention" if "/" in sm.name else f"{sm.name}/attention"
        name, i = base, 0
        while name in names:
            i += 1
            name = f"{base}_{i}"
        names.add(name)
        drop.update(id(n) for n in nodes)
        ins, before = [], []
        for root, shape in roots:
            if tuple(graph.tensor(root).shape) != shape:
                ins.append(graph.fresh_name(f"{root}_bt"))
                graph.add_tensor(Tensor(ins[-1], shape, "float32"))
                target = graph.const(graph.fresh_name(f"{root}_bt_shape"), np.array(shape, np.int64)).name
                before.append(Node("Reshape", f"{name}/{root}_bt", [root, target], [ins[-1]]))
            else:
                ins.append(root)
        after, att_out = [], out
        if tuple(graph.tensor(out).shape) != roots[0][1]:
            att_out = graph.fresh_name(f"{out}_bt")
            graph.add_tensor(Tensor(att_out, roots[0][1], "float32"))
            target = graph.const(graph.fresh_name(f"{out}_shape"), np.array(graph.tensor(out).shape, np.int64)).name
            after.append(Node("Reshape", f"{name}/out", [att_out, target], [out]))
        new[id(nodes[-1])] = [*before, Node("Attention", name, ins, [att_out], {"heads": heads, "scale": scale},
                                            "minirt"), *after]
        graph.note(name, f"fused {len(nodes)} nodes ({', '.join(sorted({n.op for n in nodes}))}) into one "
                         f"Attention: heads={heads}, scale={scale:.6g}")
    graph.nodes = [m for n in graph.nodes if id(n) not in drop or id(n) in new for m in new.get(id(n), [n])]
    graph.remove_unused()
    return graph
