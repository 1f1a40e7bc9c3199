"""conv_input_nlc: a 1-D conv that reads another im2col conv's output reads it channels-last, with no im2col.

Whisper's front end is conv1 -> GELU -> conv2, both 1-D (kernel 3) and rewritten to 2-D over a height of 1. A 1-D
conv's im2col row for output position m, with K ordered (tap, channel) as im2col writes it, is the input's positions
m * stride - pad .. m * stride - pad + kw - 1, all C channels each. Stored channels-last ([L, C] row-major) those are
kw * C consecutive elements starting at (m * stride - pad) * C: the rows of a matrix with row stride stride * C whose
rows overlap. So when the producing conv writes its output channels-last (its GEMM's rows, OUT_MODE 0, as
conv_output_nlc makes it do before a Transpose), the consuming conv's GEMM reads that buffer as its A operand
directly; reads before the buffer's start or past its end are the padding and read as zero (linear.comp and
linear_cm.glslh's A_WIN). The im2col dispatch and its scratch go.

Pattern (after conv1d_as_conv2d, conv_routing, fuse_activation and conv_output_nlc): Conv A routed to im2col, then
any Reshape/Squeeze/Unsqueeze/Flatten nodes, then Conv B routed to im2col reading the result, each tensor on the way
read by the next node only and none a graph output, A's output shaped as B's input. B must be a 1-D conv: on
[1, C, L], or on [1, C, 1, L] with a kernel height of 1 and no height padding (conv1d_as_conv2d's form); group 1,
dilation 1, C a multiple of 4 (whole vec4 per position), on the buffer GEMM (a batch image by image).

Result: A gets attrs["_out_layout"] = "NLC" and B attrs["_in_layout"] = "NLC"; both use a new tensor
'<B's input>@nlc' of shape [N, L, C]; the reshape nodes and their tensors go. Conv.infer and Conv.reference follow
these attributes. Session option conv_input_nlc=False turns the pass off."""
from __future__ import annotations

from ..graph import Tensor
from ..kernels.gemm import fast_gemm
from .conv_output_nlc import RESHAPES

OPTION = "conv_input_nlc"     # the option that switches this pass off (minirt/planner/__init__.py runs it)


def rewrite(graph, options, profile=None):
    cons, prod = graph.consumers(), graph.producers()
    drop = set()

    def sole_reader(name):
        c = cons.get(name, [])
        return len(c) == 1 and name not in graph.outputs

    for b in graph.nodes:
        if b.op != "Conv" or b.attrs.get("_route") != "im2col" or "_in_layout" in b.attrs:
            continue
        chain, x = [], b.inputs[0]
        while x in prod and prod[x].op in RESHAPES and sole_reader(x):
            chain.append(prod[x])
            x = prod[x].inputs[0]
        a = prod.get(x)
        if a is None or a.op != "Conv" or a.attrs.get("_route") != "im2col" or "_out_layout" in a.attrs \
                or not sole_reader(x):
            continue
        why = _why_not(a, b, graph, options)
        if why:
            graph.note(b.name, f"im2col kept for the input from Conv '{a.name}': {why}")
            continue
        n, c, *_h, length = graph.tensor(b.inputs[0]).shape
        nlc = graph.fresh_name(f"{b.inputs[0]}@nlc")
        graph.add_tensor(Tensor(nlc, (n, length, c), graph.tensor(b.inputs[0]).dtype))
        for t in [x] + [node.outputs[0] for node in chain]:
            del graph.tensors[t]
        drop.update(id(node) for node in chain)
        a.outputs[0], b.inputs[0] = nlc, nlc
        a.attrs["_out_layout"], b.attrs["_in_layout"] = "NLC", "NLC"
        graph.note(a.name, f"conv writes channels-last {[n, length, c]} for Conv '{b.name}'")
        graph.note(b.name, f"reads Conv '{a.name}''s channels-last output as its GEMM's A (overlapping rows, no "
                           f"im2col)" + "".join(f"; removed {node.op} '{node.name}'" for node in chain))
    if drop:
        graph.nodes = [node for node in graph.nodes if id(node) not in drop]
        graph.remove_unused()     # the reshapes' shape constants
    return graph


def _why_not(a, b, graph, options) -> str | None:
    x, w = graph.tensor(b.inputs[0]), graph.tensor(b.inputs[1])
    y = graph.tensor(a.outputs[0])
    if not (x.is_static and y.is_static and w.shape is not None and len(x.shape) in (3, 4)
            and len(w.shape) == len(x.shape)):
        return "not a 1-D or 2-D conv over static shapes"
    c = x.shape[1]
    if y.shape != x.shape:
        return f"the reshapes change {list(y.shape)} into {list(x.shape)}"
    if not fast_gemm(options.planned_storage, options, c):
        return f"the buffer GEMM does not run here ({options.planned_storage} storage, {c} channels)"
    nd = len(x.shape) - 2
    if nd == 2 and (x.shape[2] != 1 or w.shape[2] != 1):
        return f"input height {x.shape[2]} and kernel height {w.shape[2]}: not a 1-D conv"
    pads = [int(p) for p in b.attrs.get("pads", [0] * 2 * nd)]
    auto = b.attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if int(b.attrs.get("group", 1)) != 1 or any(int(d) != 1 for d in b.attrs.get("dilations", [1] * nd)):
        return "grouped or dilated"
    if auto not in ("NOTSET", "VALID") or (nd == 2 and (pads[0] or pads[2])):
        return f"padding {auto if auto not in ('NOTSET', 'VALID') else pads} is not along the length only"
    return None
