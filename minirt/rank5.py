"""Rank-5 tensors that exporters make only in passing, rewritten at rank <= 4 when a graph is prepared (kernels take
rank <= 4), and the refusal, every node named at once, of those that remain.

Picks (unstack_rank5). Attention blocks written as `qkv.reshape(b, n, 3, heads, d).permute(2, 0, 3, 1, 4)` followed
by `q, k, v = qkv[0], qkv[1], qkv[2]` (or `unbind(0)`) make a rank-5 tensor only to take one index of its first axis;
exporters write the pick as Split + Squeeze, Slice + Squeeze or Gather with a scalar index. Each pick becomes a
Slice of the Reshape's input, a Reshape to the rank-4 shape the pick keeps, and the Transpose's order on the four axes
left (none where the pick reads the Reshape directly). The Slice takes columns i * Q .. (i + 1) * Q of the input's
last axis where the picked axis (size S) and those after it (Q elements) make up that axis, as for a packed q, k, v
projection [B, T, 3 * D], whose parts are then the [B, T, D] tensors fuse_attention starts from; otherwise index i
of the middle axis of the input seen as [P, S, Q].

Unit axes (compact_rank5_transposes). torch's nn.MultiheadAttention splits its packed projection with
`unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2)`: a Transpose between rank-5 tensors that have an
axis of size 1, made by a relabelling (Reshape, Unsqueeze, Squeeze, Flatten) of a rank <= 4 tensor and read only by
relabellings back to rank <= 4. Axes of size 1 do not change the row-major order, so the Transpose runs on the other
axes of the relabelled input, and each reader becomes a Reshape of its result."""
from __future__ import annotations

import numpy as np

from .errors import UnsupportedError
from .graph import Graph, Node, Tensor


def _const_ints(graph, name):
    t = graph.tensors.get(name) if name else None
    return None if t is None or not t.is_const else [int(v) for v in np.asarray(t.data).reshape(-1)]


def _picks(graph, name, readers):
    """(axis, [(index, output name, nodes to drop)]) when every reader of `name` (rank 5) takes one index of one axis
    and drops that axis, else None."""
    out, axis = [], None
    for n in readers.get(name, []):
        if n.domain not in ("", "ai.onnx") or n.inputs[0] != name or n.op not in ("Gather", "Split", "Slice"):
            return None
        a = (_const_ints(graph, n.inputs[3] if len(n.inputs) > 3 else "") or [0])[0] if n.op == "Slice" else \
            int(n.attrs.get("axis", 0))
        if axis is not None and a % 5 != axis:
            return None
        axis = a % 5
        size = graph.tensors[name].shape[axis]
        if n.op == "Gather":
            idx = graph.tensors.get(n.inputs[1])
            if idx is None or not idx.is_const or np.asarray(idx.data).ndim != 0 or not -size <= int(idx.data) < size:
                return None
            out.append((int(idx.data) % size, n.outputs[0], [n]))
            continue
        parts = None
        if n.op == "Split":
            sizes = _const_ints(graph, n.inputs[1] if len(n.inputs) > 1 else "") or n.attrs.get("split")
            if (list(sizes) if sizes else [1] * len(n.outputs)) == [1] * size and len(n.outputs) == size:
                parts = [(i, o) for i, o in enumerate(n.outputs) if o]
        else:
            starts, ends, steps = (_const_ints(graph, n.inputs[k] if len(n.inputs) > k else "") for k in (1, 2, 4))
            if starts and ends and len(starts) == len(ends) == 1 and (steps or [1]) == [1]:
                i = starts[0] + size if starts[0] < 0 else starts[0]
                if 0 <= i < size and min(ends[0], size) == i + 1:
                    parts = [(i, n.outputs[0])]
        if parts is None:
            return None
        for i, part in parts:
            sq = readers.get(part, [])
            if not sq and part not in graph.outputs:
                continue     # a part nothing reads
            if (part in graph.outputs or len(sq) != 1 or sq[0].op != "Squeeze" or sq[0].domain not in ("", "ai.onnx")
                    or [a % 5 for a in (_const_ints(graph, sq[0].inputs[1] if len(sq[0].inputs) > 1 else "")
                                        or sq[0].attrs.get("axes", []))] != [axis]):
                return None
            out.append((i, sq[0].outputs[0], [n, sq[0]]))
    return (axis, out) if out else None


def unstack_rank5(graph: Graph) -> int:
    """Rewrite the rank-5 picks of a prepared graph (static shapes) as above, in place. Returns how many picks."""
    readers = graph.consumers()
    drop, new, count = set(), [], 0
    for r in list(graph.nodes):
        x = graph.tensors.get(r.outputs[0]) if r.op == "Reshape" and r.domain in ("", "ai.onnx") else None
        if (x is None or not x.is_static or len(x.shape) != 5 or r.outputs[0] in graph.outputs
                or not graph.tensors[r.inputs[0]].is_static or len(graph.tensors[r.inputs[0]].shape) > 4):
            continue
        perm, src = list(range(5)), r.outputs[0]
        tr = readers.get(src, [])
        if len(tr) == 1 and tr[0].op == "Transpose" and tr[0].domain in ("", "ai.onnx"):
            perm, src = [int(p) for p in tr[0].attrs.get("perm", range(4, -1, -1))], tr[0].outputs[0]
            if src in graph.outputs:
                continue
        elif any(n.op == "Transpose" for n in tr):
            continue
        found = _picks(graph, src, readers)
        if found is None:
            continue
        a, picks = found
        s, p = list(x.shape), perm[a]
        rest = [q - (q > p) for j, q in enumerate(perm) if j != a]
        kept, (P, S, Q), shape_a = s[:p] + s[p + 1:], (int(np.prod(s[:p])), s[p], int(np.prod(s[p + 1:]))), \
            tuple(graph.tensors[r.inputs[0]].shape)
        if shape_a[-1] == S * Q:     # the picked axis and those after it are the input's last: slice that
            src, axis, width, part = r.inputs[0], len(shape_a) - 1, Q, shape_a[:-1] + (Q,)
        else:                        # the input seen as [P, S, Q], sliced on its middle axis
            src, axis, width, part = graph.fresh_name(f"{r.outputs[0]}_psq"), 1, 1, (P, 1, Q)
            graph.add_tensor(Tensor(src, (P, S, Q), "float32"))
            new.append(Node("Reshape", f"{r.name}_psq", [r.inputs[0], _ints(graph, src, [P, S, Q])], [src]))
        for i, out, nodes in picks:
            sl = graph.fresh_name(f"{out}_pick")
            graph.add_tensor(Tensor(sl, part, "float32"))
            new.append(Node("Slice", f"{out}_slice", [src, _ints(graph, sl, [i * width]),
                                                      _ints(graph, sl, [(i + 1) * width]), _ints(graph, sl, [axis])],
                            [sl]))
            if rest == sorted(rest):
                new.append(Node("Reshape", f"{out}_reshape", [sl, _ints(graph, out, kept)], [out]))
            else:
                rs = graph.fresh_name(f"{out}_pick_rs")
                graph.add_tensor(Tensor(rs, tuple(kept), "float32"))
                new += [Node("Reshape", f"{out}_reshape", [sl, _ints(graph, rs, kept)], [rs]),
                        Node("Transpose", f"{out}_transpose", [rs], [out], {"perm": rest})]
            graph.note(nodes[0].name, f"unstack_rank5: index {i} of axis {p} of rank-5 '{r.outputs[0]}' as a "
                                      f"Slice of '{src}' and rank-4 Reshape and Transpose")
            drop.update(id(n) for n in nodes)
            count += 1
    _replace(graph, drop, new)
    return count


def _replace(graph, drop, new):
    """The graph's nodes without those in `drop` (ids), with `new` in order."""
    if drop:
        graph.nodes = [n for n in graph.nodes if id(n) not in drop] + new
        graph.toposort()
        graph.remove_unused()


def _ints(graph, base, values):
    return graph.const(graph.fresh_name(f"{base}_c"), np.array(values, np.int64)).name


RELABEL = ("Reshape", "Unsqueeze", "Squeeze", "Flatten")    # row-major order kept, shape relabelled


def compact_rank5_transposes(graph: Graph) -> int:
    """Rewrite the rank-5 Transposes with unit axes as above, in place. Returns how many."""
    made, readers = graph.producers(), graph.consumers()
    drop, new, count = set(), [], 0
    for t in list(graph.nodes):
        x = graph.tensors.get(t.inputs[0]) if t.op == "Transpose" and t.domain in ("", "ai.onnx") else None
        src = made.get(t.inputs[0])
        if x is None or not x.is_static or len(x.shape) != 5 or src is None or src.op not in RELABEL \
                or src.domain not in ("", "ai.onnx") or len(readers.get(t.inputs[0], [])) != 1:
            continue
        a = graph.tensors.get(src.inputs[0])
        keep = [i for i, d in enumerate(x.shape) if d != 1]
        outs = readers.get(t.outputs[0], [])
        if (a is None or not a.is_static or len(a.shape) > 4 or len(keep) > 4 or not outs or t.outputs[0] in
                graph.outputs or t.inputs[0] in graph.outputs or
                any(r.op not in RELABEL or r.domain not in ("", "ai.onnx") or r.inputs[0] != t.outputs[0]
                    or graph.tensors[r.outputs[0]].shape is None or len(graph.tensors[r.outputs[0]].shape) > 4
                    for r in outs)):
            continue
        perm = [int(p) for p in t.attrs.get("perm", range(4, -1, -1))]
        compact = graph.fresh_name(f"{t.inputs[0]}_compact")
        moved = graph.fresh_name(f"{t.outputs[0]}_compact")
        graph.add_tensor(Tensor(compact, tuple(x.shape[i] for i in keep), "float32"))
        graph.add_tensor(Tensor(moved, tuple(x.shape[p] for p in perm if p in keep), "float32"))
        new += [Node("Reshape", f"{src.name}_compact", [src.inputs[0], _ints(graph, compact,
                                                                             list(graph.tensors[compact].shape))],
                     [compact]),
                Node("Transpose", f"{t.name}_compact", [compact], [moved], {"perm": [keep.index(p) for p in perm
                                                                                     if p in keep]})]
        for r in outs:
            new.append(Node("Reshape", f"{r.name}_compact", [moved, _ints(graph, moved,
                                                                          list(graph.tensors[r.outputs[0]].shape))],
                            list(r.outputs)))
            drop.add(id(r))
        drop.update((id(src), id(t)))
        graph.note(t.name, f"compact_rank5_transposes: rank-5 '{t.inputs[0]}' without its unit axes, as a rank-"
                           f"{len(keep)} Transpose")
        count += 1
    _replace(graph, drop, new)
    return count


def refuse_high_ranks(graph: Graph) -> None:
    """Every node that reads or makes a run-time tensor of rank > 4, named at once (kernels take rank <= 4)."""
    bad = []
    for n in graph.nodes:
        high = [(t.name, len(t.shape)) for t in (graph.tensors.get(x) for x in [*n.inputs, *n.outputs] if x)
                if t is not None and not t.is_const and t.shape is not None and len(t.shape) > 4]
        if high:
            bad.append(f"  {n}: " + ", ".join(f"tensor '{name}' has rank {r}" for name, r in high))
    if bad:
        raise UnsupportedError(f"{graph.source}: {len(bad)} node(s) use tensors of rank above 4; kernels take rank "
                               f"<= 4:\n" + "\n".join(bad), bad)
