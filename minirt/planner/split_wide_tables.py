"""Split constants wider than one binding: a tensor in buffer storage is bound whole to one descriptor, so none may
pass the device's maxStorageBufferRange (128 MiB on lavapipe and on many phone and laptop GPUs). A Linear's weight or
a run-time Gather's table beyond it is split by columns into parts that each fit, read by a Linear (or Gather) of
their own, and a Concat on the last axis joins the parts' outputs into the original output: the vocabulary
projection of a Whisper large-v3 ([1280, 51866], 253 MiB at fp32) becomes two Linears of 25936 output columns, its
token embedding ([51866, 1280]) two Gathers of 640 columns a row. Every part keeps its kernel's layout, so nothing
changes below the graph; what a part costs more is one small Concat of the output (a step's logits, an embedding
row).

  Linear  W [K, N] whose packed bytes (K and N padded to 4, at the plan's element size) pass the range: parts of
          p columns, p a multiple of 16 with K padded to 32 times p within the range (the widest packing any GEMM
          kernel makes: linear_cmreg's 32 x 16 blocks), as few parts as that allows, of near-equal widths. The bias
          is split with W; an activation runs in each part; a residual is added after the Concat by an Add (the
          epilogue adds it after the activation, so the sum is the same).
  Gather  a table [V, D] read by run-time indices along axis 0 (buffer storage; in textures the host runs it):
          parts of q columns, q a multiple of 4 (the row copy's vec4), V q elements within the range.

Left alone: a Linear of several parts (merge_siblings') or one writing a state tensor (it owns the state's memory),
each with a note. Planes already within the range are not touched, so every plan whose tensors fit is the same with
or without this pass; where it splits, a note on the node names the tensor, its size, the limit and the parts."""
from __future__ import annotations

import numpy as np

from ..graph import Node, Tensor
from .memory_plan import _size


def _ceil(n: int, m: int) -> int:
    return -(-n // m) * m


def _widths(n: int, fits, unit: int) -> list[int] | None:
    """Column counts (multiples of unit except the last) that split n columns into as few near-equal parts as
    fits(columns) allows; None where even `unit` columns do not fit."""
    most = (n // unit) * unit
    while most >= unit and not fits(most):
        most -= unit
    if most < unit:
        return None
    parts = -(-n // most)
    width = _ceil(-(-n // parts), unit)
    out = [width] * (n // width)
    if n % width:
        out.append(n % width)
    return out


def rewrite(graph, options, profile):
    limit = profile.max_storage_buffer_range
    itemsize = 2 if options.precision == "fp16" else 4
    buffers = options.planned_storage == "buffer"
    out_nodes = []
    for node in graph.nodes:
        made = None
        if node.op == "Linear" and node.domain == "minirt":
            made = _linear(graph, node, limit, itemsize, profile)
        elif node.op == "Gather" and node.domain == "" and buffers:
            made = _gather(graph, node, limit, itemsize, profile)
        out_nodes.extend(made or [node])
    graph.nodes = out_nodes
    return graph


def _parts(graph, src, widths):
    """[(first column, columns, a fresh name for that column block of constant src)]."""
    out, at = [], 0
    for w in widths:
        out.append((at, w, graph.fresh_name(f"{src}[:, {at}:{at + w}]")))
        at += w
    return out


def _linear(graph, node, limit, itemsize, profile):
    ins = list(node.inputs) + [""] * (4 - len(node.inputs))
    x, w, b, r = ins[:4]
    wt = graph.tensor(w)
    if not wt.is_const or wt.data.ndim != 2:
        return None
    k, n = (int(d) for d in wt.data.shape)
    packed = _ceil(k, 4) * _ceil(n, 4) * itemsize
    if packed <= limit:
        return None
    why = (f"weight '{w}' [{k}, {n}] is {_size(packed)} packed, beyond the maxStorageBufferRange "
           f"of '{profile.name}' ({_size(limit)})")
    y = node.outputs[0]
    if int(node.attrs.get("parts", 1)) != 1 or y in graph.state.values() or (len(node.inputs) > 4 and node.inputs[4]):
        graph.note(node.name, why + ": not split (a Linear of merged parts, one writing a state tensor, or one of a "
                                    "quantized weight)")
        return None
    widths = _widths(n, lambda c: _ceil(k, 32) * _ceil(c, 16) * itemsize <= limit, 16)
    if widths is None:
        graph.note(node.name, why + f": not split (one column block of {_ceil(k, 32)} rows is beyond it)")
        return None
    shape = graph.tensor(y).shape
    made, outs = [], []
    for at, cols, name in _parts(graph, w, widths):
        graph.const(name, wt.data[:, at:at + cols])     # a view: lowering packs it
        bias = ""
        if b:
            bias = graph.fresh_name(f"{b}[{at}:{at + cols}]")
            graph.const(bias, np.ascontiguousarray(graph.tensor(b).data.reshape(-1)[at:at + cols]))
        part = graph.fresh_name(f"{y}[..., {at}:{at + cols}]")
        graph.add_tensor(Tensor(part, tuple(shape[:-1]) + (cols,), graph.tensor(y).dtype))
        made.append(Node("Linear", f"{node.name}[{at}:{at + cols}]", [x, name, bias, ""], [part], dict(node.attrs),
                         node.domain))
        outs.append(part)
    joined = y
    if r:
        joined = graph.fresh_name(f"{y}.no_residual")
        graph.add_tensor(Tensor(joined, tuple(shape), graph.tensor(y).dtype))
    made.append(Node("Concat", f"{node.name}.concat", outs, [joined], {"axis": -1}))
    if r:
        made.append(Node("Add", f"{node.name}.residual", [joined, r], [y]))
    graph.note(node.name, why + f": split into {len(widths)} Linears of {', '.join(map(str, widths))} output columns "
               f"(at most {_size(_ceil(k, 32) * _ceil(widths[0], 16) * itemsize)} each), joined by a Concat"
               + (" and the residual added after it" if r else ""))
    return made


def _gather(graph, node, limit, itemsize, profile):
    if len(node.inputs) < 2 or int(node.attrs.get("axis", 0)) != 0:
        return None
    table, idx = graph.tensor(node.inputs[0]), graph.tensor(node.inputs[1])
    if not table.is_const or idx.is_const or table.data.ndim != 2:
        return None
    v, d = (int(s) for s in table.data.shape)
    if v * d * itemsize <= limit:
        return None
    why = (f"table '{table.name}' [{v}, {d}] is {_size(v * d * itemsize)}, beyond the "
           f"maxStorageBufferRange of '{profile.name}' ({_size(limit)})")
    widths = _widths(d, lambda c: v * c * itemsize <= limit, 4)
    if widths is None:
        graph.note(node.name, why + ": not split (4 columns of it are beyond it)")
        return None
    y = node.outputs[0]
    shape = graph.tensor(y).shape
    made, outs = [], []
    for at, cols, name in _parts(graph, table.name, widths):
        graph.const(name, table.data[:, at:at + cols])   # a view: lowering copies it
        part = graph.fresh_name(f"{y}[..., {at}:{at + cols}]")
        graph.add_tensor(Tensor(part, tuple(shape[:-1]) + (cols,), graph.tensor(y).dtype))
        made.append(Node("Gather", f"{node.name}[{at}:{at + cols}]", [name, node.inputs[1]], [part],
                         dict(node.attrs), node.domain))
        outs.append(part)
    made.append(Node("Concat", f"{node.name}.concat", outs, [y], {"axis": -1}))
    graph.note(node.name, why + f": split into {len(widths)} Gathers of {', '.join(map(str, widths))} columns a row "
               f"(at most {_size(v * widths[0] * itemsize)} each), joined by a Concat")
    return made
