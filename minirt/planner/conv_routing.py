"""Conv routing: every Conv gets one kernel choice, decided here and nowhere else.

  depthwise  groups == C_in == C_out (weight [C, 1, ...])             -> the depthwise kernel
  linear     2-D, 1x1 kernel, groups 1, stride 1, no padding, C_in a
             multiple of 4, a concrete batch, on the buffer GEMM with
             the conv_channels_last pass on                           -> a Linear over the pixels of a channels-last
                                                                         input (rows N * H * W, K = C_in)
  pointwise  1x1 kernel, groups 1, stride 1, no padding, a concrete
             batch (above 1: as for im2col)                          -> a GEMM on the NCHW activation directly
  im2col     groups 1, dilation 1, 2-D, a concrete batch (above 1:
             buffer storage, each image's input and output at an
             aligned offset), kernel not 1x1 with C_out >= 128; on the
             buffer GEMM also any kernel (a strided or padded 1x1: a
             pixel gather) whose GEMM has IM2COL_MIN_MACS or more     -> im2col into scratch + tiled GEMM
  direct     everything else                                          -> the direct kernel

The C_out threshold is ExecuTorch's: below it the im2col gather costs more than the GEMM saves. On the buffer GEMM
(glsl/linear.comp and the tensor-core kernels, 5-20x the direct kernel's rate at ResNet-50's shapes on an H200) a
conv whose GEMM is large takes im2col whatever its C_out: ResNet-50's 7x7 stem (12544 x 147 x 64) and its 64-channel
3x3 convs (3136 x 576 x 64) are 115-118 M multiply-adds each, where the gather is one pass over the input per tap.
A batch runs the im2col and pointwise routes image by image where the output is NCHW (ops/conv.py): each image's
im2col and GEMM are batch 1's, on views of the batch's input and output, so a batch costs each image what one image
costs; channels-last outputs (conv_channels_last) take the whole batch as more GEMM rows."""
from __future__ import annotations

import numpy as np

from ..kernels.gemm import fast_gemm

IM2COL_MIN_COUT = 128
# On the buffer GEMM, im2col whatever C_out from this many multiply-adds (M x K x N) on: the direct kernel's 546
# GFLOP/s against 3.8 TFLOP/s for linear.comp (ResNet-50 on an H200, docs/benchmarks.md) make 4 M multiply-adds about
# 15 us direct, several times the two dispatches' fixed cost.
IM2COL_MIN_MACS = 1 << 22
ROUTES = ("linear", "im2col", "pointwise", "depthwise", "direct")


def route(node, graph, storage="buffer", align=16, options=None) -> tuple[str, str]:
    """(route, reason) for a Conv node of a shape-inferred graph; storage: where activations live; align: the
    device's storage buffer offset alignment (bytes), which each image's offset in a batch must keep; options: the
    Session's (the buffer GEMM and the channels-last pass widen the GEMM routes; None: as with both off)."""
    w = graph.tensor(node.inputs[1])
    x = graph.tensor(node.inputs[0])
    g = int(node.attrs.get("group", 1))
    oc, icg, *ks = w.shape
    if g > 1 and icg == 1 and oc == g:
        return "depthwise", f"depthwise: groups {g} == channels"
    if g != 1:
        return "direct", f"groups {g} != 1"
    batch = _batch_refusal(node, graph, storage, align)
    fast = options is not None and _fast(storage, options) and len(ks) == 2 and x.is_static
    strides = list(node.attrs.get("strides", [1] * len(ks)))
    if all(k == 1 for k in ks):
        pads = list(node.attrs.get("pads", [])) if node.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET") else []
        if any(s != 1 for s in strides) or any(pads):     # (auto_pad: a 1x1 kernel at stride 1 needs no padding)
            big = fast and not batch and _macs(node, graph) >= IM2COL_MIN_MACS
            if big:
                return "im2col", (f"1x1 kernel with strides {strides}, pads {pads}: a pixel gather + the buffer GEMM "
                                  f"({_macs(node, graph)} multiply-adds)" + _by_image(x))
            return "direct", f"1x1 kernel with strides {strides}, pads {pads} (the pointwise GEMM reads every pixel)"
        if fast and icg % 4 == 0 and options.pass_on("conv_channels_last"):
            return "linear", "1x1 kernel: a Linear over the pixels of the channels-last input"
        if batch:
            return "direct", batch
        return "pointwise", "1x1 kernel: a GEMM on the activation" + _by_image(x)
    dil = list(node.attrs.get("dilations", [1] * len(ks)))
    if any(d != 1 for d in dil):
        return "direct", f"dilation {dil} != 1"
    if len(ks) != 2:
        if oc < IM2COL_MIN_COUT:
            return "direct", f"out_channels {oc} < {IM2COL_MIN_COUT} (im2col threshold)"
        return "direct", "1-D conv not rewritten to 2-D (im2col runs 2-D convs)"
    big = oc < IM2COL_MIN_COUT and fast and _macs(node, graph) >= IM2COL_MIN_MACS
    if oc < IM2COL_MIN_COUT and not big:
        return "direct", f"out_channels {oc} < {IM2COL_MIN_COUT} (im2col threshold)"
    if batch:
        return "direct", batch
    if big:
        return "im2col", (f"im2col + the buffer GEMM: out_channels {oc} < {IM2COL_MIN_COUT} but "
                          f"{_macs(node, graph)} multiply-adds >= {IM2COL_MIN_MACS}" + _by_image(x))
    return "im2col", "im2col + tiled GEMM" + _by_image(x)


def _fast(storage, options) -> bool:
    return fast_gemm(storage, options)


def _macs(node, graph) -> int:
    """Multiply-adds of the conv's GEMM (its output's elements times C_in x kernel), from the inferred output."""
    y, w = graph.tensor(node.outputs[0]), graph.tensor(node.inputs[1])
    if not y.is_static:
        return 0
    return int(np.prod(y.shape, dtype=np.int64)) * int(np.prod(w.shape[1:], dtype=np.int64))


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
            r, why = route(node, graph, options.planned_storage, align, options)
            forced = options.conv_route
            if forced:
                r, why = forced, f"forced by option conv_route={forced}"
            node.attrs["_route"] = r
            graph.note(node.name, f"route: {r} ({why})")
    return graph
