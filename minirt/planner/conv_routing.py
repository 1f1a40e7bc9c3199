"""Conv routing: every Conv gets one kernel choice, decided here and nowhere else.

  depthwise  groups == C_in == C_out (weight [C, 1, ...])             -> the depthwise kernel
  pointwise  1x1 kernel, groups 1, stride 1, no padding, a concrete
             batch (above 1: as for im2col)                          -> a GEMM on the activation directly
  im2col     groups 1, dilation 1, kernel not 1x1, C_out >= 128,
             2-D, a concrete batch (above 1: buffer storage, each
             image's input and output at an aligned offset)          -> im2col into scratch + tiled GEMM
  direct     everything else                                          -> the direct kernel

The C_out threshold is ExecuTorch's: below it the im2col gather costs more than the GEMM saves. A batch runs the
im2col and pointwise routes image by image (ops/conv.py): each image's im2col and GEMM are batch 1's, on views of the batch's
input and output, so a batch costs each image what one image costs."""
from __future__ import annotations

import numpy as np

IM2COL_MIN_COUT = 128
ROUTES = ("im2col", "pointwise", "depthwise", "direct")


def route(node, graph, storage="buffer", align=16) -> tuple[str, str]:
    """(route, reason) for a Conv node of a shape-inferred graph; storage: where activations live; align: the
    device's storage buffer offset alignment (bytes), which each image's offset in a batch must keep."""
    w = graph.tensor(node.inputs[1])
    x = graph.tensor(node.inputs[0])
    g = int(node.attrs.get("group", 1))
    oc, icg, *ks = w.shape
    if g > 1 and icg == 1 and oc == g:
        return "depthwise", f"depthwise: groups {g} == channels"
    if g != 1:
        return "direct", f"groups {g} != 1"
    batch = _batch_refusal(node, graph, storage, align)
    if all(k == 1 for k in ks):
        strides = list(node.attrs.get("strides", [1] * len(ks)))
        pads = list(node.attrs.get("pads", [])) if node.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET") else []
        if any(s != 1 for s in strides) or any(pads):     # (auto_pad: a 1x1 kernel at stride 1 needs no padding)
            return "direct", f"1x1 kernel with strides {strides}, pads {pads} (the pointwise GEMM reads every pixel)"
        if batch:
            return "direct", batch
        return "pointwise", "1x1 kernel: a GEMM on the activation" + _by_image(x)
    dil = list(node.attrs.get("dilations", [1] * len(ks)))
    if any(d != 1 for d in dil):
        return "direct", f"dilation {dil} != 1"
    if oc < IM2COL_MIN_COUT:
        return "direct", f"out_channels {oc} < {IM2COL_MIN_COUT} (im2col threshold)"
    if len(ks) != 2:
        return "direct", "1-D conv not rewritten to 2-D (im2col runs 2-D convs)"
    if batch:
        return "direct", batch
    return "im2col", "im2col + tiled GEMM" + _by_image(x)


def _by_image(x) -> str:
    return f", image by image (batch {x.shape[0]})" if x.shape[0] != 1 else ""


def _batch_refusal(node, graph, storage, align) -> str | None:
    """Why the GEMM routes cannot take this conv's batch, or None: they run a batch image by image, on views of the
    batch's input and output, which need buffer storage and each image at an offset the device can bind."""
    x, y = graph.tensor(node.inputs[0]), graph.tensor(node.outputs[0])
    n = x.shape[0]
    if not isinstance(n, int):
        return f"batch {n} is not concrete"
    if n == 1:
        return None
    if storage != "buffer":
        return f"batch {n} in {storage} storage (a batch's images are buffer views)"
    # 2 bytes an element: the offsets of fp16's 16-bit activations, and so of float32's too
    per = [2 * int(np.prod(t.shape[1:], dtype=np.int64)) for t in (x, y)]
    if any(b % max(int(align), 1) for b in per):
        return f"batch {n}: an image's {per} bytes are not a multiple of the offset alignment {align}"
    return None


def annotate(graph, options, profile=None):
    """Record each Conv's route in its attrs (minirt-private key) and the reason in the notes."""
    align = profile.min_storage_buffer_offset_alignment if profile is not None else 16
    for node in graph.nodes:
        if node.op == "Conv":
            r, why = route(node, graph, options.planned_storage, align)
            forced = options.conv_route
            if forced:
                r, why = forced, f"forced by option conv_route={forced}"
            node.attrs["_route"] = r
            graph.note(node.name, f"route: {r} ({why})")
    return graph
