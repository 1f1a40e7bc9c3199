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

from ..kernels import ROW_VEC4_PER_LANE as REG, act_code, spec, variant
from ..plan import Dispatch, Plan, Push

OPTION = "fuse_reduce_layer_norm"     # the option that switches this pass off (minirt/planner/__init__.py runs it)

REDUCE, LAYER_NORM = "linear_reduce", "layer_norm_rows"


def _plain_reduce(d: Dispatch) -> bool:
    """A linear_reduce that writes its output in the activation type (not post=ln, not io=out32)."""
    return d.stem == REDUCE and d.axes.get("post", "none") == "none" and d.axes.get("io", "elem") == "elem"


def _fuse(red: Dispatch, ln: Dispatch) -> Dispatch:
    """The post=ln reduce (in the LayerNorm's dtype and io variant) that writes the LayerNorm's output at binding 0 and
    the GEMM's at binding 5."""
    (out, _), (part, _), (bias, _), (res, _) = red.args
    (z, _), _x, (w, _) = ln.args
    r, n = red.info, ln.info
    axes = {**ln.axes, "post": "ln"}
    return Dispatch(kernel=variant(REDUCE, **axes), node=red.node, op=red.op,
                    args=[(z, "w"), (part, "r"), (bias, "r"), (res, "r"), (w, "r"), (out, "w")],
                    push=Push().ivec4(r["rows"], r["n4"], n["rows_per_group"], r["splits"]).vec4(n["eps"]).bytes(),
                    spec=spec(REDUCE, ACT=act_code(r["act"]), HAS_RES=r["has_res"], LN_BIAS=n["has_bias"]),
                    global_size=ln.global_size, family=ln.family, flops=red.flops + ln.flops,
                    bytes=red.bytes + ln.bytes, stem=REDUCE, axes=axes, info={**n, "splits": r["splits"]})


def rewrite(plan: Plan, profile, options) -> Plan:
    kept, pending = [], {}      # pending: tensor root -> index in kept of the plain reduce that wrote it last
    for d in plan.dispatches:
        if d.stem == LAYER_NORM and plan.root(d.args[1][0]) in pending:
            i = pending.pop(plan.root(d.args[1][0]))
            red = kept[i]
            rows, n4 = red.info["rows"], red.info["n4"]
            if ((d.info["rows"], d.info["n4"]) == (rows, n4) and n4 <= REG * profile.subgroup_size
                    and red.args[0][0] == d.args[1][0]):
                kept[i] = _fuse(red, d)
                plan.notes.setdefault(red.node, []).append(f"LayerNorm '{d.node}' folded into the reduce pass")
                continue
        for name in d.writes:        # a later writer: the LayerNorm would no longer read what the reduce wrote
            pending.pop(plan.root(name), None)
        if _plain_reduce(d):
            pending[plan.root(d.args[0][0])] = len(kept)
        kept.append(d)
    plan.dispatches = kept
    return plan
