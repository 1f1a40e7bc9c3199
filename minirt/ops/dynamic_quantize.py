"""DynamicQuantize (minirt's own, made by the fold_dynamic_quantize pass from onnxruntime's quantize_dynamic
output): x -> (q, scale): ONNX's DynamicQuantizeLinear of x to uint8, given as q less its zero point (whole numbers in
[-255, 255], what MatMulInteger multiplies) and the scale. glsl/dynamic_quantize.comp, one work group, buffers."""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..kernels.quantize import dynamic_quantize_dispatch
from . import Op, register


def dynamic_quantize(x):
    """(q - zero point, scale) of ONNX's DynamicQuantizeLinear (uint8), in float32."""
    x = np.asarray(x, np.float32)
    lo, hi = min(float(x.min(initial=0.0)), 0.0), max(float(x.max(initial=0.0)), 0.0)
    s = np.float32((hi - lo) / 255.0)
    if s == 0:
        return np.zeros_like(x), np.float32(0)
    z = np.clip(np.rint(np.float32(-lo) / s), 0, 255)
    q = np.clip(np.rint(x / s) + z, 0, 255)
    return (q - z).astype(np.float32), s


@register
class DynamicQuantize(Op):
    name = "DynamicQuantize"
    domain = "minirt"
    limits = "made by the planner (fold_dynamic_quantize); buffer storage"

    def infer(self, node, ins):
        return [(ins[0].shape, "float32"), ((), "float32")]

    def reference(self, node, x):
        q, s = dynamic_quantize(x)
        return [q, np.array(s, np.float32)]

    def lower(self, node, ctx):
        if ctx.storage != "buffer":
            raise UnsupportedError(f"{node}: runs in buffer storage only")
        x, q, s = ctx.t(node.inputs[0]), ctx.t(node.outputs[0]), ctx.t(node.outputs[1])
        dynamic_quantize_dispatch(ctx, x, q, s)


_FOLDED = "runs only as quantize_dynamic writes it (DynamicQuantizeLinear -> MatMulInteger with a constant int8 / uint8 weight -> Cast to float), which fold_dynamic_quantize puts on the int8 GEMM"


@register
class DynamicQuantizeLinear(Op):
    name = "DynamicQuantizeLinear"
    limits = _FOLDED

    def infer(self, node, ins):
        return [(ins[0].shape, "uint8"), ((), "float32"), ((), "uint8")]

    def fold(self, node, ins):
        return None

    def reference(self, node, x):
        c, s = dynamic_quantize(x)
        lo = min(float(np.min(x, initial=0.0)), 0.0)
        z = np.uint8(np.clip(np.rint(np.float32(-lo) / s), 0, 255)) if s else np.uint8(0)
        return [(c + z).astype(np.uint8), np.array(s, np.float32), np.array(z, np.uint8)]

    def lower(self, node, ctx):
        raise UnsupportedError(f"{node}: DynamicQuantizeLinear {_FOLDED}")


@register
class MatMulInteger(Op):
    name = "MatMulInteger"
    limits = _FOLDED

    def infer(self, node, ins):
        # typed float32 (ONNX: int32): its sums are whole numbers a float holds exactly below 2^24, and the Cast to
        # float that follows is then float32 -> float32, which minirt takes
        a, b = ins[0], ins[1]
        return [(tuple(a.shape[:-1]) + (b.shape[-1],), "float32")]

    def fold(self, node, ins):
        return None

    def reference(self, node, a, b, az=None, bz=None):
        a = a.astype(np.int64) - (0 if az is None else np.asarray(az, np.int64))
        b = b.astype(np.int64) - (0 if bz is None else np.asarray(bz, np.int64))
        return [(a @ b).astype(np.float32)]

    def lower(self, node, ctx):
        raise UnsupportedError(f"{node}: MatMulInteger {_FOLDED}")
