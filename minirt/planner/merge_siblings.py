"""Merge sibling Linears into one GEMM: Linear nodes (made by fuse_linear) that read the same x, have the same
activation, no residual and constant 2-D weights of the same K and N become one Linear whose W is their weights
side by side (each part's scale folded into its columns and bias first, so the merged node has scale 1; a part
without bias gets zeros), followed by one SplitParts node that hands out the original outputs. The Whisper
encoder's q, k and v projections are the case: three M x 384 x 384 GEMMs, each too small to fill a large GPU,
become one M x 384 x 1152 GEMM.

How the parts are represented: the merged Linear (attribute parts = P) writes its output part-major,
[P, M, N] (M = the rows of x; the GEMM epilogue's OUT_MODE 2 puts column j of the merged product at part
j // N), so each part is one contiguous range and SplitParts lowers to free views at an offset
(TensorSpec.view_offset). The other layout, [M, P * N] with strided slices, would need every consumer kernel
to take a row stride. A view's offset becomes a descriptor offset, which Vulkan wants a multiple of
minStorageBufferOffsetAlignment: groups whose part size (M * N elements) is not are left alone.

Linears that write a state tensor (Graph.state) are left out: their output already has its own memory. The merged
output and weight are each bound whole, so a group whose merged tensors would pass the device's
maxStorageBufferRange is merged in consecutive groups that fit (a note says so), or not at all where two parts do not.
Left alone as well, with a note: texture storage (an image cannot be viewed at an offset, and its GEMM has no
part-major output: merging would need a copy per part), the general GEMM fallback (K not a multiple of 4, or
Session option fast_gemm off), and parts of different widths. Option merge_siblings=False turns the
pass off. make_plan gives the pass the resolved storage (in the options) and the device; without them it
assumes buffer storage and the largest alignment Vulkan allows (256 bytes)."""
from __future__ import annotations

import numpy as np

from ..graph import Node, Tensor
from ..ops.int8_weight import int8_operands

OPTION = "merge_siblings"     # the option that switches this pass off (minirt/planner/__init__.py runs it)

MAX_ALIGNMENT = 256    # the largest minStorageBufferOffsetAlignment Vulkan allows


def _candidate(graph, node):
    """(x, act, K, N) grouping key of a Linear that may merge, or None."""
    if node.op != "Linear" or node.domain != "minirt" or int(node.attrs.get("parts", 1)) != 1 or \
            "block" in node.attrs:     # blocked 4-bit weights (fold_dequantize_linear) stay single
        return None
    ins = list(node.inputs) + [""] * (4 - len(node.inputs))
    x, w, b, r = ins[:4]
    if r or node.outputs[0] in graph.state.values():     # a state's new value: written where the state lives
        return None
    wt, xt = graph.tensor(w), graph.tensor(x)
    if not wt.is_const or wt.data.ndim != 2 or not xt.is_static or not xt.shape or xt.shape[-1] != wt.data.shape[0]:
        return None
    if b and not graph.tensor(b).is_const:
        return None
    quant = int8_operands(graph, node) is not None      # int8 weights merge with int8 weights only
    return x, node.attrs.get("act", "") or "", int(wt.data.shape[0]), int(wt.data.shape[1]), quant


def _merged_name(names, taken):
    """'/layers.0/self_attn/q_proj/MatMul', '.../k_proj/MatMul' -> '/layers.0/self_attn/q_proj+k_proj'."""
    split = [n.split("/") for n in names]
    common = 0
    while all(len(s) > common + 1 for s in split) and len({s[common] for s in split}) == 1:
        common += 1
    base = "/".join(split[0][:common] + ["+".join(s[common] for s in split)])
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def rewrite(graph, options, profile=None):
    storage = options.planned_storage
    align = profile.min_storage_buffer_offset_alignment if profile is not None else MAX_ALIGNMENT
    itemsize = 2 if options.precision == "fp16" else 4

    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        key = _candidate(graph, node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    replace, drop = {}, set()
    taken = {n.name for n in graph.nodes}
    for (x, act, k, n, quant), members in groups.items():
        if len(members) < 2:
            continue
        names = [m.name for m in members]
        m_rows = int(np.prod(graph.tensor(x).shape[:-1], dtype=np.int64))
        why = None
        if storage != "buffer":
            why = (f"{storage} storage: an image cannot be viewed at an offset, so the parts would need copies "
                   f"(the separate GEMMs are cheaper)")
        elif k % 4 or not options.fast_gemm:
            why = "the Linears run on the general GEMM (K not a multiple of 4, or fast_gemm off), which has no part-major output"
        elif (m_rows * n * itemsize) % max(align, 1):
            why = (f"a part is {m_rows * n * itemsize} bytes, not a multiple of the device's storage-buffer offset "
                   f"alignment ({align}), so the parts cannot be views")
        limit = profile.max_storage_buffer_range if profile is not None else 0
        most = len(members)
        if not why and limit:      # the merged output and weight, one binding each, within the device's range
            most = min(most, limit // (m_rows * n * itemsize), limit // (-(-k // 4) * 4 * n * itemsize))
            if most < 2:
                why = (f"two parts' output or weight would be beyond the device's maxStorageBufferRange "
                       f"({limit >> 20} MiB)")
        if why:
            for nm in names:
                graph.note(nm, f"not merged with its {len(members) - 1} sibling Linear(s) reading '{x}': {why}")
            continue
        for at in range(0, len(members), most):     # groups whose merged tensors fit, in order
            if len(members[at:at + most]) > 1:
                _merge(graph, members[at:at + most], x, act, k, n, quant, m_rows, taken, replace, drop,
                       f" (groups of {most}: more would be beyond maxStorageBufferRange)" if most < len(members) else "")
    if not replace:
        return graph
    nodes = []
    for node in graph.nodes:
        if id(node) in replace:
            nodes += replace[id(node)]
        elif id(node) not in drop:
            nodes.append(node)
    graph.nodes = nodes
    graph.remove_unused()
    return graph


def _merge(graph, members, x, act, k, n, quant, m_rows, taken, replace, drop, why=""):
    """One Linear over `members`' weights side by side (int8 with their column scales where `quant`), and the
    SplitParts handing out their outputs."""
    names = [m.name for m in members]
    parts = len(members)
    w = np.empty((k, parts * n), np.int8 if quant else np.float32)
    wscale, wzero = np.empty(parts * n, np.float32), np.zeros(parts * n, np.float32)
    bias = np.zeros(parts * n, np.float32)
    has_bias = False
    for i, mem in enumerate(members):
        s = float(mem.attrs.get("scale", 1.0))
        if quant:      # the part's scale folds into its column scales
            q, cs, cz = int8_operands(graph, mem)
            w[:, i * n:(i + 1) * n] = q
            wscale[i * n:(i + 1) * n] = cs * np.float32(s)
            wzero[i * n:(i + 1) * n] = 0 if cz is None else cz
        else:
            w[:, i * n:(i + 1) * n] = np.asarray(graph.tensor(mem.inputs[1]).data, np.float32) * s
        if len(mem.inputs) > 2 and mem.inputs[2]:
            bias[i * n:(i + 1) * n] = np.asarray(graph.tensor(mem.inputs[2]).data, np.float32).reshape(-1) * s
            has_bias = True
    name = _merged_name(names, taken)
    taken.update((name, f"{name}/split"))
    w_name = graph.fresh_name(f"{name}/weight")
    graph.const(w_name, w)
    b_name = ""
    if has_bias:
        b_name = graph.fresh_name(f"{name}/bias")
        graph.const(b_name, bias)
    qins = []
    if quant:
        qins = [graph.const(graph.fresh_name(f"{name}/weight_scale"), wscale).name, ""]
        if wzero.any():
            qins[1] = graph.const(graph.fresh_name(f"{name}/weight_zero"), wzero).name
    y = graph.fresh_name(f"{name}_output_0")
    graph.add_tensor(Tensor(y, (parts, m_rows, n), "float32"))
    outs = [mem.outputs[0] for mem in members]
    shapes = [tuple(graph.tensor(o).shape) for o in outs]
    merged = Node("Linear", name, [x, w_name, b_name, "", *qins], [y], {"act": act, "scale": 1.0, "parts": parts},
                  "minirt")
    split = Node("SplitParts", f"{name}/split", [y], outs, {"shapes": shapes}, "minirt")
    replace[id(members[0])] = [merged, split]    # the first member's place: x exists, no part is read yet
    drop.update(id(mem) for mem in members[1:])
    graph.note(name, f"merged {parts} sibling Linears reading '{x}' ({', '.join(names)}) into one GEMM: "
                     f"M={m_rows}, K={k}, N={parts}x{n}; output part-major [{parts}, {m_rows}, {n}], each part a "
                     f"view at an offset{why}")
