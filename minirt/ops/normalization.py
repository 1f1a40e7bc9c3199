"""Row normalisations: LayerNormalization, InstanceNormalization and Softmax. Each reduces over a set of trailing dims
(one dim for Softmax >= 13; the spatial dims for InstanceNormalization) with one work group per row; see
glsl/rows.glslh for the work split."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..kernels import spec
from ..kernels.rows import layer_norm_rows
from ..plan import Push
from . import Op, attr, register
from ._util import norm_axis, same

THREADS_MAX = 128     # threads cooperating on one row
GROUPS_MAX = 65535    # per dispatch axis: rows are spread over y and z


def _mask(dims):
    """Bitmask of WHCN dims."""
    return sum(1 << d for d in dims)


def row_dispatch(ctx, kernel, out, x, mask, extra_args=(), push_tail=(), consts=(), flops_per=4, io=None, cfg=()):
    """One work group per texel row of x (see rows.glslh) on glsl/<kernel>.comp; mask = the reduced WHCN dims; consts:
    its specialization constants (minirt.kernels.spec); io as in ctx.dispatch; cfg: up to two more ints of the
    kernel's cfg, after the packed dim and the mask."""
    ts = list(x.whcn)
    ts[x.packed_dim] = (ts[x.packed_dim] + 3) // 4
    per_row = int(np.prod([ts[d] for d in range(4) if mask >> d & 1]))
    rows = int(np.prod(ts)) // per_row
    threads = min(THREADS_MAX, 1 << (per_row - 1).bit_length())
    gy = min(rows, GROUPS_MAX)
    p = Push().sizes(x).ivec4(x.packed_dim, mask, *cfg)
    for v in push_tail:
        p.vec4(v)
    ctx.dispatch(kernel, [(out.name, "w"), (x.name, "r"), *extra_args], p, consts,
                 (threads, gy, -(-rows // gy)), "reduction", flops=flops_per * x.numel,
                 nbytes=16 * x.numel, io=io, axes={"storage": ctx.storage})   # x read 3 times, out written once


@register
class LayerNormalization(Op):
    name = "LayerNormalization"
    limits = ("Scale and B must be constants; the Mean and InvStdDev outputs are not supported; "
              "computes in fp32 whatever stash_type says")

    def infer(self, node, ins):
        shape = ins[0].shape
        axis = norm_axis(node, attr(node, "axis", -1), len(shape))
        stats = tuple(shape[:axis]) + (1,) * (len(shape) - axis)
        return [(shape, ins[0].dtype), (stats, "float32"), (stats, "float32")]

    def reference(self, node, x, scale, bias=None):
        axis = norm_axis(node, attr(node, "axis", -1), x.ndim)
        dims = tuple(range(axis, x.ndim))
        mean = x.mean(dims, keepdims=True)
        inv = 1 / np.sqrt(((x - mean) ** 2).mean(dims, keepdims=True) + attr(node, "epsilon", 1e-5))
        y = (x - mean) * inv * scale + (0 if bias is None else bias)
        return [y.astype(x.dtype), mean.astype(np.float32), inv.astype(np.float32)]

    def check(self, node, ins):
        if any(node.outputs[1:]):
            return "the Mean and InvStdDev outputs are not supported (only Y)"
        for i, what in ((1, "Scale"), (2, "B")):
            if i < len(ins) and ins[i] is not None and not ins[i].is_const:
                return f"{what} ('{node.inputs[i]}') is computed at run time; minirt needs it to be a constant"
        if ins[0].is_static:
            norm = ins[0].shape[norm_axis(node, attr(node, "axis", -1), len(ins[0].shape)):]
            for t in ins[1:]:
                if t is not None and not _broadcasts_to(t.shape, norm):
                    return (f"'{t.name}' of shape {list(t.shape)} does not broadcast to the normalised "
                            f"shape {list(norm)}")

    def lower(self, node, ctx):
        x, out = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        rank = len(x.shape)
        k = rank - norm_axis(node, attr(node, "axis", -1), rank)   # normalised dims: WHCN 0..k-1
        consts = [ctx.graph.tensor(n).data for n in node.inputs[1:3] if n]
        if k == 1 and x.shape[-1] % 4 == 0 and ctx.storage == "buffer" and ctx.profile.tuning.subgroup_rows:
            return layer_norm_rows(ctx, node, x, out, consts)
        affine = np.concatenate([_per_texel(a, x.shape[rank - k:], x.packed_dim) for a in consts])
        w = ctx.weight(f"{node.name}/scale_bias", affine)
        row_dispatch(ctx, "layer_norm", out, x, _mask(range(k)), [(w.name, "r")],
                     [attr(node, "epsilon", 1e-5)], spec("layer_norm", HAS_BIAS=len(consts) > 1), flops_per=8,
                     io="out32")


@register
class InstanceNormalization(Op):
    name = "InstanceNormalization"
    limits = "scale and B must be constants; 1-D and 2-D (rank 3 and 4) inputs"

    def infer(self, node, ins):
        if len(ins[0].shape) < 3:
            raise ModelError(f"{node}: InstanceNormalization needs an input of rank >= 3 (N, C, spatial dims)")
        return same(node, ins)

    def check(self, node, ins):
        for i, what in ((1, "scale"), (2, "B")):
            if not ins[i].is_const:
                return f"{what} ('{node.inputs[i]}') is computed at run time; minirt needs it to be a constant"
            c = ins[0].shape[1]
            if tuple(ins[i].shape) != (c,) and isinstance(c, int):
                return f"{what} ('{node.inputs[i]}') has shape {list(ins[i].shape)}, expected [{c}] (one per channel)"

    def reference(self, node, x, scale, bias):
        dims = tuple(range(2, x.ndim))
        x64 = x.astype(np.float64)
        mean = x64.mean(dims, keepdims=True)
        var = ((x64 - mean) ** 2).mean(dims, keepdims=True)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        y = (x64 - mean) / np.sqrt(var + attr(node, "epsilon", 1e-5)) * scale.reshape(shape) + bias.reshape(shape)
        return [y.astype(x.dtype)]

    def lower(self, node, ctx):
        rank = len(ctx.graph.tensor(node.inputs[0]).shape)
        per_channel_norm(node, ctx, range(rank - 2), rank - 2)


def per_channel_norm(node, ctx, dims, channel):
    """Normalise node's input over the WHCN `dims` on the layer_norm kernel, with scale and bias (node inputs 1 and
    2, constants) one value per index of WHCN dim `channel`."""
    x, out = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
    scale, bias = (np.asarray(ctx.graph.tensor(n).data, np.float32).reshape(-1) for n in node.inputs[1:3])
    c4 = -(-scale.size // 4)
    w = ctx.weight(f"{node.name}/scale_bias", np.concatenate([np.pad(scale, (0, 4 * c4 - scale.size)), bias]))
    row_dispatch(ctx, "layer_norm", out, x, _mask(dims), [(w.name, "r")], [attr(node, "epsilon", 1e-5)],
                 spec("layer_norm", HAS_BIAS=True, PER_CHANNEL=True), flops_per=8, io="out32", cfg=(channel, c4))


@register
class AxisLayerNorm(Op):
    """LayerNorm over one axis that is not the last (ConvNeXt's over the channels of NCHW), with one scale and bias
    per index of that axis: made by the fuse_layer_norm pass from the ReduceMean chain exporters write for it. Runs
    on the layer_norm kernel as InstanceNormalization does, the normalised dim being the per-channel one."""
    name, domain = "AxisLayerNorm", "minirt"
    limits = "internal, made by the fuse_layer_norm pass; one axis of a tensor of rank <= 4"

    def infer(self, node, ins):
        return same(node, ins)

    def reference(self, node, x, scale, bias):
        axis = attr(node, "axis")
        x64 = x.astype(np.float64)
        mean = x64.mean(axis, keepdims=True)
        var = ((x64 - mean) ** 2).mean(axis, keepdims=True)
        shape = [1] * x.ndim
        shape[axis] = -1
        y = (x64 - mean) / np.sqrt(var + attr(node, "epsilon")) * scale.reshape(shape) + bias.reshape(shape)
        return [y.astype(x.dtype)]

    def lower(self, node, ctx):
        dim = len(ctx.graph.tensor(node.inputs[0]).shape) - 1 - attr(node, "axis")       # its WHCN dim
        per_channel_norm(node, ctx, [dim], dim)


def _broadcasts_to(shape, target):
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def _per_texel(a, norm_shape, pd):
    """Scale or bias laid out as one vec4 per texel of a row (row-major over the row's texels): the
    lanes along pd when pd is normalised, else the texel's one element repeated for its 4 lanes."""
    k = len(norm_shape)
    a = np.broadcast_to(np.asarray(a, np.float32), norm_shape)
    if pd >= k:
        return np.repeat(a.reshape(-1), 4)
    ax = k - 1 - pd
    a = np.pad(a, [(0, -a.shape[ax] % 4 if i == ax else 0) for i in range(k)])
    a = a.reshape(a.shape[:ax] + (-1, 4) + a.shape[ax + 1:])
    return np.moveaxis(a, ax + 1, -1).reshape(-1)


@register
class Softmax(Op):
    name = "Softmax"

    @staticmethod
    def _dims(node, rank):
        """ONNX dims reduced over: one axis (opset >= 13) or all from the axis on (older: coerce to 2-D)."""
        legacy = attr(node, "_opset", 13) < 13
        axis = norm_axis(node, attr(node, "axis", 1 if legacy else -1), rank)
        return tuple(range(axis, rank)) if legacy else (axis,)

    def infer(self, node, ins):
        if not ins[0].shape:
            raise ModelError(f"{node}: Softmax needs an input of rank >= 1")
        return same(node, ins)

    def reference(self, node, x):
        dims = self._dims(node, x.ndim)
        e = np.exp(x - x.max(dims, keepdims=True))
        return [(e / e.sum(dims, keepdims=True)).astype(x.dtype)]

    def lower(self, node, ctx):
        x, out = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        rank = len(x.shape)
        row_dispatch(ctx, "softmax", out, x, _mask(rank - 1 - a for a in self._dims(node, rank)))
