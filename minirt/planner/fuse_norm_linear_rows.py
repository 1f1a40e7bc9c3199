"""Fold a LayerNorm into the few-row Linear that reads it (a pass over the Plan, after lowering). A decoder step's
LayerNorms each feed one Linear of a few rows (glsl/linear_rows.comp: q/k/v, the cross-attention query, fc1, the
logits); that kernel can normalise its input rows as it reads them (its LN constant), so the LayerNorm's dispatch
and its output tensor go: one dispatch instead of two, about a tenth of a Whisper step's dispatches.

A layer_norm_rows dispatch and a later linear_rows dispatch fuse when the Linear reads exactly the LayerNorm's output
(same rows, row length K), nothing else reads that output and it is not a graph output, nothing writes the
LayerNorm's input in between (the Linear reads it later than the LayerNorm did), and both read and write the
activation type (the LayerNorm not reading or writing a float32 graph edge). Session option
fuse_norm_linear_rows=False turns the pass off."""
from __future__ import annotations

from ..kernels.gemm import rows_push, rows_spec
from ..plan import Dispatch, Plan

OPTION = "fuse_norm_linear_rows"     # the option that switches this pass off (minirt/planner/__init__.py runs it)

LAYER_NORM, ROWS = "layer_norm_rows", "linear_rows"


def _fuse(ln: Dispatch, lin: Dispatch) -> Dispatch:
    """The linear_rows dispatch that reads the LayerNorm's input and normalises it (LN), its scale and bias at
    binding 5."""
    (_z, _), (x, _), (w, _) = ln.args
    out, _a, wt, bt, res, _, *q = lin.args     # q: an int8 weight's scales (binding 6)
    i, n = lin.info, ln.info
    return Dispatch(kernel=lin.kernel, node=lin.node, op=lin.op, args=[out, (x, "r"), wt, bt, res, (w, "r"), *q],
                    push=rows_push(i, n["eps"]).bytes(), spec=rows_spec(i, ln=True, ln_bias=n["has_bias"]),
                    global_size=lin.global_size, family=lin.family, local_size=lin.local_size,
                    shared_xy=lin.shared_xy, flops=lin.flops + ln.flops, bytes=lin.bytes, stem=ROWS,
                    axes=lin.axes, info={**i, "ln": ln.node})


def rewrite(plan: Plan, profile, options) -> Plan:
    readers: dict[str, int] = {}
    for d in plan.dispatches:
        for name in d.reads:
            readers[plan.root(name)] = readers.get(plan.root(name), 0) + 1
    outputs = {plan.root(o) for o in plan.outputs}
    kept, pending = [], {}     # pending: LayerNorm output root -> (index in kept, the LayerNorm's input root)
    for d in plan.dispatches:
        a = plan.root(d.args[1][0]) if d.stem == ROWS else None
        if a in pending:
            i, x = pending.pop(a)
            ln = kept[i]
            if (readers.get(a) == 1 and a not in outputs and ln.args[0][0] == d.args[1][0]
                    and (ln.info["rows"], 4 * ln.info["n4"]) == (d.info["rows"], d.info["k"])
                    and ln.axes.get("io", "elem") == "elem" and ln.axes.get("dtype") == d.axes.get("dtype")):
                kept[i] = None
                kept.append(_fuse(ln, d))
                plan.notes.setdefault(d.node, []).append(f"LayerNorm '{ln.node}' folded into this few-row Linear")
                continue
        for name in d.writes:      # a later writer of a LayerNorm's input: that LayerNorm stays
            r = plan.root(name)
            for k in [k for k, (_, x) in pending.items() if x == r or k == r]:
                del pending[k]
        if d.stem == LAYER_NORM:
            pending[plan.root(d.args[0][0])] = (len(kept), plan.root(d.args[1][0]))
        kept.append(d)
    plan.dispatches = [d for d in kept if d is not None]
    return plan
