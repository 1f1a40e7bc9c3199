"""fold_layer_norm: a LayerNormalization whose only reader is a Linear's A input goes into that Linear's GEMM.

In the Whisper encoder every LayerNorm but the last feeds exactly one GEMM (the merged q/k/v projection or fc1);
on its own each is a dispatch and a barrier. Folded, the GEMM normalises each row of A as it fetches it (glsl
linear.comp / linear_cm.glslh, NORM_A: per-row mean and 1 / sqrt(var + eps) over the whole row, computed by each
work group before its main loop), and the LayerNorm's affine part goes into the constants:
    LN(x) @ W + b = xhat @ (diag(gamma) W) + (b + beta @ W),   xhat = (x - mean) / sqrt(var + eps)
so the Linear gets W' = gamma[:, None] * W ([K, N], as Linear stores it), b' = b + beta @ W (computed in float64,
stored float32 as new constants: the old ones may be shared) and attrs["norm_eps"], and reads the LayerNorm's input.
The Linear's scale, activation, residual and parts apply after, as before.

Applies when: the LayerNorm normalises the last axis only, its scale (and bias, if any) are constants that
broadcast to [K], its Mean / InvStdDev outputs are not used, its output is no graph output and has one reader, a
Linear (minirt's) reading it as A only, with a constant 2-D weight and no LayerNorm folded in yet; and that Linear
runs on the buffer GEMM (fast_gemm: buffer storage, K a multiple of 4, not no_fast_gemm), the only kernels with
NORM_A. Runs after fuse_linear and merge_siblings, so the Linear it sees is the final one. Session option
fold_layer_norm=False turns it off."""
from __future__ import annotations

import numpy as np

from ..ops._util import norm_axis
from .merge_siblings import _off


def _affine(graph, name, k):
    """A LayerNorm scale or bias as float64 [K], or None where it is not a constant broadcasting to [K]."""
    if not name:
        return np.zeros(k)
    t = graph.tensor(name)
    if not t.is_const:
        return None
    try:
        return np.broadcast_to(np.asarray(t.data, np.float64), (k,))
    except ValueError:
        return None


def _target(graph, ln, cons):
    """The Linear the LayerNorm may fold into, or None (nothing to say); with a reason when it may not."""
    y = ln.outputs[0]
    readers = cons.get(y, [])
    if y in graph.outputs or len(readers) != 1:
        return None, None
    lin = readers[0]
    ins = list(lin.inputs) + [""] * (4 - len(lin.inputs))
    if lin.op != "Linear" or lin.domain != "minirt" or ins[0] != y or y in ins[1:]:
        return None, None
    x = graph.tensor(ln.inputs[0])
    w = graph.tensor(ins[1])
    if "norm_eps" in lin.attrs or not w.is_const or w.data.ndim != 2 or not x.is_static or not x.shape:
        return lin, "the Linear already has a LayerNorm folded in, or its weight is not a constant 2-D matrix"
    rank = len(x.shape)
    if norm_axis(ln, int(ln.attrs.get("axis", -1)), rank) != rank - 1:
        return lin, "the LayerNorm normalises more than the last axis"
    if any(ln.outputs[1:]):
        return lin, "the LayerNorm's Mean / InvStdDev outputs are used"
    if x.dtype != "float32":
        return lin, f"the LayerNorm's input is {x.dtype}"
    return lin, None


def rewrite(graph, options):
    if _off(options.get("fold_layer_norm", True)):
        return graph
    from ..ops.gemm import fast_gemm   # here, not at import: the ops package imports the planner
    storage = options.get("_storage", "buffer")
    cons = graph.consumers()
    drop = set()
    for ln in graph.nodes:
        if ln.op != "LayerNormalization" or ln.domain:
            continue
        lin, why = _target(graph, ln, cons)
        if lin is None:
            continue
        k = int(graph.tensor(ln.inputs[0]).shape[-1])
        ins = list(lin.inputs) + [""] * (4 - len(lin.inputs))
        gamma = _affine(graph, ln.inputs[1], k)                             # Scale: a required input
        beta = _affine(graph, ln.inputs[2] if len(ln.inputs) > 2 else "", k)
        if why is None and (gamma is None or beta is None):
            why = f"its scale or bias is not a constant of {k} values"
        if why is None and not fast_gemm(storage, options, k):
            why = (f"the Linear runs on the general GEMM ({storage} storage, K = {k}"
                   f"{', no_fast_gemm' if options.get('no_fast_gemm') else ''}), which cannot normalise its input")
        if why:
            graph.note(ln.name, f"not folded into Linear '{lin.name}': {why}")
            continue
        w = np.asarray(graph.tensor(ins[1]).data, np.float64)
        b = np.asarray(graph.tensor(ins[2]).data, np.float64).reshape(-1) if ins[2] else np.zeros(w.shape[1])
        w_name = graph.const(graph.fresh_name(f"{lin.name}/weight_ln"), (gamma[:, None] * w).astype(np.float32)).name
        b_name = graph.const(graph.fresh_name(f"{lin.name}/bias_ln"), (b + beta @ w).astype(np.float32)).name
        lin.inputs = [ln.inputs[0], w_name, b_name, ins[3]]
        lin.attrs["norm_eps"] = float(ln.attrs.get("epsilon", 1e-5))
        drop.add(id(ln))
        graph.note(lin.name, f"folded LayerNormalization '{ln.name}' into this GEMM: it normalises its A rows "
                             f"(eps {lin.attrs['norm_eps']:g}); scale and bias folded into W and b")
    if drop:
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
        graph.remove_unused()
    return graph
