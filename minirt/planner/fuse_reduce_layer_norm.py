"""Fold a LayerNorm into the reduce pass of the split-K GEMM that produces its input (a pass over the Plan, after
lowering). linear_reduce adds a split GEMM's fp32 partials; with one subgroup per row (layer_norm_rows.comp's layout)
the same pass can keep the row in registers and normalise it too: the post=ln variants of glsl/linear_reduce.comp
write both the GEMM's output and the LayerNorm's, one dispatch instead of two. In the Whisper encoder every fc2 and
conv2 feeds a LayerNorm; where their K splits across work groups (big discrete GPUs), that LayerNorm's dispatch goes.

A reduce dispatch and a layer_norm_rows dispatch fuse when the LayerNorm reads exactly the reduce's output (the
same rows and row length), nothing writes that tensor in between, the reduce writes it in the activation type (not
a float32 graph output through io=out32), and a row fits the registers of one subgroup (REG x subgroup size vec4,
as in the kernel). Session option fuse_reduce_layer_norm=False turns the pass off."""
from __future__ import annotations

import struct

from .plan import Dispatch, Plan

REDUCE, LAYER_NORM, FUSED = "linear_reduce", "layer_norm_rows", "linear_reduce_ln"
REG = 4     # vec4 of a row per lane (glsl/linear_reduce.comp, as layer_norm_rows.comp)


def _dtype_suffix(kernel: str, base: str):
    """'' or '_half' (and '_out32' for the LayerNorm) after the kernel's base name, or None if not that kernel."""
    if not kernel.startswith(base):
        return None
    rest = kernel[len(base):]
    return rest if rest in ("", "_half", "_half_out32") else None


def _fuse(red: Dispatch, ln: Dispatch) -> Dispatch:
    m, _n, n4, splits = struct.unpack_from("<4i", red.push)
    (out, _), (part, _), (bias, _), (res, _) = red.args
    (z, _), _x, (w, _) = ln.args
    act, has_res = red.spec
    push = struct.pack("<4i", m, n4, struct.unpack_from("<4i", ln.push)[2], splits) + ln.push[16:32]
    return Dispatch(kernel=FUSED + _dtype_suffix(ln.kernel, LAYER_NORM), node=red.node, op=red.op,
                    args=[(z, "w"), (part, "r"), (bias, "r"), (res, "r"), (w, "r"), (out, "w")], push=push,
                    spec=(act, has_res, *ln.spec), global_size=ln.global_size, family=ln.family,
                    flops=red.flops + ln.flops, bytes=red.bytes + ln.bytes)


def rewrite(plan: Plan, profile, options) -> Plan:
    if not options.pass_on("fuse_reduce_layer_norm"):
        return plan
    kept, pending = [], {}      # pending: tensor root -> index in kept of the plain reduce that wrote it last
    for d in plan.dispatches:
        if _dtype_suffix(d.kernel, LAYER_NORM) is not None and plan.root(d.args[1][0]) in pending:
            i = pending.pop(plan.root(d.args[1][0]))
            red = kept[i]
            m, _n, n4, _s = struct.unpack_from("<4i", red.push)
            rows, l4 = struct.unpack_from("<4i", d.push)[:2]
            if (rows, l4) == (m, n4) and n4 <= REG * profile.subgroup_size and red.args[0][0] == d.args[1][0]:
                kept[i] = _fuse(red, d)
                plan.notes.setdefault(red.node, []).append(f"LayerNorm '{d.node}' folded into the reduce pass")
                continue
        for name in d.writes:        # a later writer: the LayerNorm would no longer read what the reduce wrote
            pending.pop(plan.root(name), None)
        if _dtype_suffix(d.kernel, REDUCE) in ("", "_half"):
            pending[plan.root(d.args[0][0])] = len(kept)
        kept.append(d)
    plan.dispatches = kept
    return plan
