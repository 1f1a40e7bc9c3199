"""Elementwise ops: binary with numpy broadcasting, and unary functions. One kernel each, the
function chosen by a specialization constant."""
from __future__ import annotations

import numpy as np

from ..kernels import ACTIVATIONS, activate, activation_of, clip, erf, spec
from ..plan import Push
from . import Op, attr, register
from ._util import broadcast_shapes, same


def elementwise_dispatch(ctx, kernel, code, out, ins, flops_per=1, params=None):
    """out = f(ins) on glsl/<kernel>.comp ("unary" or "binary"), f its OP `code`; params: the unary kernel's
    function parameters (prm: clip bounds, hard sigmoid's alpha and beta)."""
    p = Push().sizes(out)
    for t in ins:
        p.sizes(t)
    p.ivec4(out.packed_dim, *[t.packed_dim for t in ins])
    if params is not None:
        p.vec4(*params)
    ctx.dispatch(kernel, [(out.name, "w")] + [(t.name, "r") for t in ins], p, spec(kernel, OP=code),
                 out.texel_extents, "elementwise", flops=flops_per * out.numel,
                 nbytes=4 * (out.numel + sum(t.numel for t in ins)), axes={"storage": ctx.storage})


def activation_dispatch(ctx, act, out, x):
    """out = act(x) on the unary kernel, act an epilogue activation (minirt.kernels.ACTIVATIONS), for an epilogue no
    kernel fuses."""
    elementwise_dispatch(ctx, "unary", ACTIVATIONS[act].unary, out, [x], flops_per=8)


def copy_dispatch(ctx, out, src):
    """out = src elementwise (same shape): a real copy, for when a view is not possible."""
    elementwise_dispatch(ctx, "unary", 0, out, [src], 0)


class Binary(Op):
    code = 0
    fn = None

    def infer(self, node, ins):
        return [(broadcast_shapes(node, ins[0].shape, ins[1].shape), ins[0].dtype)]

    def reference(self, node, a, b):
        with np.errstate(all="ignore"):
            r = type(self).fn(a, b)
        return [np.asarray(r).astype(np.result_type(a, b), copy=False)]

    def lower(self, node, ctx):
        elementwise_dispatch(ctx, "binary", self.code, ctx.t(node.outputs[0]),
                             [ctx.t(node.inputs[0]), ctx.t(node.inputs[1])])


def _div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(np.asarray(a) / np.asarray(b)).astype(np.result_type(a, b))  # ONNX integer Div truncates
    return np.divide(a, b)


@register
class Add(Binary):
    name, code, fn = "Add", 0, staticmethod(np.add)


@register
class Sub(Binary):
    name, code, fn = "Sub", 1, staticmethod(np.subtract)


@register
class Mul(Binary):
    name, code, fn = "Mul", 2, staticmethod(np.multiply)


@register
class Div(Binary):
    name, code, fn = "Div", 3, staticmethod(_div)


@register
class Pow(Binary):
    name, code = "Pow", 4
    limits = "float32 exponent only on the GPU"

    @staticmethod
    def fn(a, b):
        return np.power(a, b.astype(a.dtype) if np.issubdtype(a.dtype, np.floating) else b)


class Unary(Op):
    code = 0

    def infer(self, node, ins):
        return same(node, ins)

    def reference(self, node, x):
        with np.errstate(all="ignore"):
            return [np.asarray(self.fn(node, x)).astype(x.dtype, copy=False)]

    def lower(self, node, ctx):
        elementwise_dispatch(ctx, "unary", self.code_for(node), ctx.t(node.outputs[0]), [ctx.t(node.inputs[0])],
                             flops_per=4, params=self.params(node, ctx.graph))

    def code_for(self, node):
        return self.code

    def params(self, node, graph):
        """The kernel's prm (float parameters of the function), or None where it takes none."""
        return None


@register
class Identity(Op):
    name = "Identity"

    def infer(self, node, ins):
        return same(node, ins)

    def reference(self, node, x):
        return [x]

    def lower(self, node, ctx):
        out, src = ctx.t(node.outputs[0]), ctx.t(node.inputs[0])
        if ctx.can_view(out, src):
            ctx.view(out, src)
        else:
            copy_dispatch(ctx, out, src)


@register
class Sqrt(Unary):
    name, code = "Sqrt", 1

    def fn(self, node, x):
        return np.sqrt(x)


@register
class Erf(Unary):
    name, code = "Erf", 2

    def fn(self, node, x):
        return erf(x)


@register
class Gelu(Unary):
    name = "Gelu"

    def check(self, node, ins):
        if attr(node, "approximate", "none") not in ("none", "tanh"):
            return f"approximate={attr(node, 'approximate')!r} (expected 'none' or 'tanh')"

    def code_for(self, node):
        return ACTIVATIONS[activation_of(node.op, node.attrs)].unary

    def fn(self, node, x):
        return activate(x, activation_of(node.op, node.attrs))


@register
class Relu(Unary):
    name, code = "Relu", ACTIVATIONS["relu"].unary

    def fn(self, node, x):
        return activate(x, "relu")


@register
class Sigmoid(Unary):
    name, code = "Sigmoid", 6

    def fn(self, node, x):
        return 1 / (1 + np.exp(-x))


@register
class Tanh(Unary):
    name, code = "Tanh", 7

    def fn(self, node, x):
        return np.tanh(x)


@register
class Neg(Unary):
    name, code = "Neg", 8

    def fn(self, node, x):
        return -x


@register
class Exp(Unary):
    name, code = "Exp", 9

    def fn(self, node, x):
        return np.exp(x)


@register
class Abs(Unary):
    name, code = "Abs", 10

    def fn(self, node, x):
        return np.abs(x)


@register
class Log(Unary):
    name, code = "Log", 14

    def fn(self, node, x):
        return np.log(x)


@register
class Reciprocal(Unary):
    name, code = "Reciprocal", 15

    def fn(self, node, x):
        return np.reciprocal(x)


@register
class ReplaceNaN(Unary):
    """Where(IsNaN(x), value, x) as exporters write it after a masked softmax (a row that is all mask gives NaN,
    replaced by 0): folded into this one op when the graph is prepared (minirt.infer.fold_nan_guards), so no
    boolean tensor is made. x with each NaN replaced by `value`."""
    name, code, domain = "ReplaceNaN", 16, "minirt"
    limits = "made when a graph is prepared, from Where(IsNaN(x), constant, x)"

    def params(self, node, graph):
        return float(attr(node, "value", 0.0)), 0.0

    def fn(self, node, x):
        return np.where(np.isnan(x), np.float32(attr(node, "value", 0.0)), x)


@register
class HardSigmoid(Unary):
    name, code = "HardSigmoid", 12

    def params(self, node, graph):
        return float(attr(node, "alpha", 0.2)), float(attr(node, "beta", 0.5))

    def fn(self, node, x):
        alpha, beta = self.params(node, None)
        return clip(np.float32(alpha) * x + np.float32(beta), 0, 1)


@register
class HardSwish(Unary):
    name, code = "HardSwish", ACTIVATIONS["hard_swish"].unary

    def fn(self, node, x):
        return activate(x, "hard_swish")


@register
class Silu(Unary):
    """x * Sigmoid(x), as exporters write SiLU (Swish): made by the fuse_silu pass, which later passes fuse into the
    producer's epilogue."""
    name, code, domain = "Silu", ACTIVATIONS["silu"].unary, "minirt"
    limits = "internal, made by the fuse_silu pass from Mul(x, Sigmoid(x))"

    def fn(self, node, x):
        return activate(x, "silu")


@register
class Clip(Unary):
    name, code = "Clip", 11
    limits = "min and max given as inputs (opset 11+) must be constants after folding"

    def check(self, node, ins):
        for i, what in ((1, "min"), (2, "max")):
            if i < len(ins) and ins[i] is not None and not ins[i].is_const:
                return f"{what} ('{node.inputs[i]}') is computed at run time; minirt needs it to be a constant"
            if i < len(ins) and ins[i] is not None and ins[i].data.size != 1:
                return f"{what} ('{node.inputs[i]}') has {ins[i].data.size} elements; Clip takes a scalar"

    def bounds(self, node, lo=None, hi=None):
        """(min, max): from the inputs (opset 11+), else the attributes (opset 6), else unbounded."""
        if len(node.inputs) > 1 or lo is not None or hi is not None:
            return (-np.inf if lo is None else float(np.asarray(lo).reshape(-1)[0]),
                    np.inf if hi is None else float(np.asarray(hi).reshape(-1)[0]))
        return float(attr(node, "min", -np.inf)), float(attr(node, "max", np.inf))

    def params(self, node, graph):
        data = [graph.tensor(n).data if n else None for n in node.inputs[1:3]]
        return self.bounds(node, *data)

    def reference(self, node, x, lo=None, hi=None):
        return [np.asarray(clip(x, *self.bounds(node, lo, hi))).astype(x.dtype, copy=False)]
