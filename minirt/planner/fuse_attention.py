"""Fuse multi-head attention written out as head splits, two MatMuls and a Softmax into one Attention node
(domain minirt, glsl/attention.comp), so the [B, H, T, T] scores never reach memory:

    q [B, T, D] -> Reshape [B, T, H, dh] -> Transpose(0,2,1,3) -> Qh     (k likewise -> Kt [B, H, dh, T],
    Softmax(MatMul(Qh, Kt) [* or / scalar]) -> MatMul(., Vh) -> Transpose(0,2,1,3) -> Reshape [B, T, D]

Exporters spell the head splits differently (K through Transpose(0,2,3,1), or Transpose(0,2,1,3) then
(0,1,3,2), or the dynamo exporter's Reshape [B*H, T, dh] -> Transpose(0,2,1) -> Reshape [B, H, dh, T]; extra
no-op Reshapes; scalar Muls on Qh and Kt), so the chains are not matched node by node: each Reshape-like and
Transpose is applied to a symbolic layout (every axis a list of the atoms B, T, H, dh, outermost first) and
the result must be the layout the MatMuls need. Scalar Mul/Div by constants on Qh, Kt or the scores fold into
`scale`.

Masked attention (text models: torch's SDPA export) adds float terms to the scaled scores before the Softmax and may
guard its result against the NaN of a fully masked row:

    Softmax(MatMul(Qh, Kt) [* scale] + mask [+ mask2]) [-> ReplaceNaN(0)] -> MatMul(., Vh)

Each added term must broadcast to the scores [B, H, Tq, Tk] (every dim 1 or full); one term is the Attention node's
fourth input, several are summed first by an Add node (shared by the layers that add the same terms: T5's position
bias and padding mask), all constant ones folded. `mask_shape` (the term's shape, padded to 4 dims on the left) lets
the kernel read it with broadcast strides; `nan_zero` = 1 records the ReplaceNaN(0), so a row whose every score is
-inf gives 0 instead of NaN. A scalar scale after an added term would scale the mask too: not matched.
Every intermediate must be read only inside the pattern and must not be a graph output. Where no [B, T, D] tensor
starts or ends a chain, one that is that but for axes of size 1 does (nn.MultiheadAttention's [T, 1, D] at batch 1:
the same row-major order), through a Reshape into or out of the Attention."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..graph import Node, Tensor

OPTION = "fuse_attention"     # the option that switches this pass off (minirt/planner/__init__.py runs it)

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


def _reaches_matmul(prod, name, depth=MAX_CHAIN):
    """Whether tensor `name` is a MatMul's output through Mul, Div and Add nodes (the scores' side of an Add)."""
    node = prod.get(name)
    if node is None or depth == 0:
        return False
    return node.op == "MatMul" or node.op in ("Mul", "Div", "Add") and any(
        _reaches_matmul(prod, x, depth - 1) for x in node.inputs)


def _score_chain(graph, prod, cur):
    """Up from the Softmax's input through scalar Mul/Div and added terms to the scores MatMul: (MatMul, nodes
    top-down, scale, added terms top-down), or None."""
    scores, terms, scale = [], [], 1.0
    while cur in prod and prod[cur].op in ("Mul", "Div", "Add") and len(scores) < MAX_CHAIN:
        node = prod[cur]
        if node.op == "Add":
            if scale != 1.0 and any(n.op != "Add" for n in scores):
                return None     # a scale applied after this term would scale it too
            path = [x for x in node.inputs if _reaches_matmul(prod, x)]
            if len(node.inputs) != 2 or len(path) != 1 or graph.tensor(path[0]).shape != \
                    graph.tensor(node.outputs[0]).shape:
                return None
            terms.insert(0, node.inputs[1] if node.inputs[0] == path[0] else node.inputs[0])
            x = path[0]
        else:
            x = _data_input(graph, node)
            if x is None:
                return None
            scale *= _scale_of(graph, node, x)
        scores.insert(0, node)
        cur = x
    mm1 = prod.get(cur)
    return (mm1, scores, scale, terms) if mm1 is not None and mm1.op == "MatMul" else None


def _mask_shape(graph, terms, full):
    """The broadcast shape of the added terms, padded to 4 dims, when every one is float32 and each of its dims is 1
    or the scores' own; else None."""
    shape = [1, 1, 1, 1]
    for name in terms:
        t = graph.tensor(name)
        s = t.shape
        if t.dtype not in ("float32", None) or s is None or len(s) > 4 or not all(isinstance(d, int) for d in s):
            return None
        s = (1,) * (4 - len(s)) + tuple(s)
        if any(d not in (1, f) for d, f in zip(s, full)):
            return None
        shape = [max(a, d) for a, d in zip(shape, s)]
    return shape


def _match(graph, prod, cons, sm):
    if len(graph.tensor(sm.inputs[0]).shape or ()) != 4 or ops.get("Softmax")._dims(sm, 4) != (3,):
        return None
    after, guard = cons.get(sm.outputs[0], []), []
    if len(after) == 1 and after[0].op == "ReplaceNaN" and float(after[0].attrs.get("value", 0.0)) == 0.0:
        guard = after
        after = cons.get(guard[0].outputs[0], [])
    p = (guard or [sm])[0].outputs[0]
    if len(after) != 1 or after[0].op != "MatMul" or after[0].inputs[0] != p:
        return None
    mm2 = after[0]
    found = _score_chain(graph, prod, sm.inputs[0])
    if found is None:
        return None
    mm1, scores, scale, terms = found
    shapes = [graph.tensor(n).shape for n in (mm1.inputs[0], mm1.inputs[1], mm2.inputs[1])]
    if not all(s is not None and len(s) == 4 and all(isinstance(d, int) for d in s) for s in shapes):
        return None
    (B, H, Tq, dh), (_, _, _, Tk) = shapes[0], shapes[1]
    if shapes[1] != (B, H, dh, Tk) or shapes[2] != (B, H, Tk, dh) or graph.tensor(mm1.inputs[0]).dtype != "float32":
        return None
    mask_shape = _mask_shape(graph, terms, (B, H, Tq, Tk))
    if mask_shape is None:
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
    flat = [a for ax in want for a in ax]
    # to [B, Tq, D]; else to [B Tq, D] rows, or the last tensor that is [B, Tq, D] but for axes of size 1 (the
    # Attention's output then is reshaped to it)
    while layout != want or graph.tensor(cur).shape != (B, Tq, H * dh):
        if tail and graph.tensor(cur).shape == (B * Tq, H * dh) and [a for ax in layout for a in ax] == flat:
            break       # [B Tq, D] (the dynamo exporter's rows for a Gemm): the Attention's output, reshaped
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
    nodes = list({id(n): n for n in [n for k in "qkv" for n in split[k][1]] + [mm1, *scores, sm, *guard, mm2, *tail]}
                 .values())
    roots = [split[k][0] for k in "qkv"]
    inner = {o for n in nodes for o in n.outputs if o} - {cur}
    members = {id(n) for n in nodes}
    if any(r in inner for r in roots + terms) or any(o in graph.outputs for o in inner) or \
            any(id(c) not in members for o in inner for c in cons.get(o, [])):
        return None
    shapes = [(B, T, H * dh) for T in (Tq, Tk, Tk)]     # what Attention reads; a root of another shape is reshaped
    return nodes, list(zip(roots, shapes)), cur, (B, Tq, H * dh), H, scale, terms, mask_shape, bool(guard)


def _mask_input(graph, terms, sums, base):
    """The one tensor the Attention reads as its mask: the term itself, their sum folded where all are constant, or
    the output of Add nodes made once per set of terms (sums: terms -> (tensor, nodes to place first))."""
    if len(terms) == 1:
        return terms[0], []
    key = tuple(terms)
    if key in sums:
        return sums[key][0], []
    if all(graph.tensor(t).is_const for t in terms):
        shape = np.broadcast_shapes(*(graph.tensor(t).data.shape for t in terms))
        graph.charge(4 * int(np.prod(shape)) * len(terms), f"the sum of the attention masks of '{base}'")
        data = sum(graph.tensor(t).data.astype(np.float32) for t in terms)
        name = graph.const(graph.fresh_name(base + "/mask"), data.astype(np.float32)).name
        sums[key] = (name, [])
        return name, []
    made, acc = [], terms[0]
    for t in terms[1:]:
        a, b = graph.tensor(acc).shape, graph.tensor(t).shape
        rank = max(len(a), len(b))
        pa, pb = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
        out = graph.add_tensor(Tensor(graph.fresh_name(base + "/mask"), tuple(max(x, y) for x, y in zip(pa, pb)),
                                      "float32")).name
        made.append(Node("Add", out, [acc, t], [out]))
        acc = out
    sums[key] = (acc, made)
    return acc, made


def rewrite(graph, options, profile=None):
    prod, cons = graph.producers(), graph.consumers()
    drop, new, sums = set(), {}, {}
    names = {n.name for n in graph.nodes}
    for sm in graph.nodes:
        if sm.op != "Softmax" or id(sm) in drop:
            continue
        m = _match(graph, prod, cons, sm)
        if m is None:
            continue
        nodes, roots, out, shape, heads, scale, terms, mask_shape, nan_zero = m
        why = ops.get("Attention", "minirt").head_problem(shape[-1], heads)
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
        for root, rshape in roots:
            if tuple(graph.tensor(root).shape) != rshape:
                ins.append(graph.fresh_name(f"{root}_bt"))
                graph.add_tensor(Tensor(ins[-1], rshape, "float32"))
                target = graph.const(graph.fresh_name(f"{root}_bt_shape"), np.array(rshape, np.int64)).name
                before.append(Node("Reshape", f"{name}/{root}_bt", [root, target], [ins[-1]]))
            else:
                ins.append(root)
        attrs, made, what = {"heads": heads, "scale": scale}, list(before), ""
        if terms:
            mask, masks = _mask_input(graph, terms, sums, name)
            made += masks
            ins.append(mask)
            attrs["mask_shape"] = mask_shape
            what = f", mask {mask_shape} ('{mask}'{f', the sum of {len(terms)} terms' if len(terms) > 1 else ''})"
        if nan_zero:
            attrs["nan_zero"] = 1
            what += ", a fully masked row gives 0 (ReplaceNaN)"
        if graph.tensor(out).shape != shape:      # [B Tq, D] rows, or [Tq, 1, D]: a Reshape (a view) of [B, Tq, D]
            y = graph.add_tensor(Tensor(graph.fresh_name(name + "/out"), shape, "float32")).name
            rows = graph.const(graph.fresh_name(name + "/rows"), np.array(graph.tensor(out).shape, np.int64)).name
            made = made + [Node("Attention", name, ins, [y], attrs, "minirt")]
            new[id(nodes[-1])] = made + [Node("Reshape", name + "/rows", [y, rows], [out])]
        else:
            new[id(nodes[-1])] = made + [Node("Attention", name, ins, [out], attrs, "minirt")]
        graph.note(name, f"fused {len(nodes)} nodes ({', '.join(sorted({n.op for n in nodes}))}) into one "
                         f"Attention: heads={heads}, scale={scale:.6g}{what}")
    graph.nodes = [x for n in graph.nodes if id(n) not in drop or id(n) in new for x in new.get(id(n), [n])]
    graph.remove_unused()
    return graph
