"""Shape-family ops that move float data on the GPU. Reshape, Flatten, Squeeze and Unsqueeze are free
views where the layout allows (always in buffer storage), else a copy by row-major index; Transpose,
Slice, Expand and Gather are one affine gather copy (glsl/copy.comp), Pad one padding copy on the same kernel
(minirt/ops/pad.py, with Tile); Concat has its own kernel.
Every one folds through its numpy reference when its inputs are constants (shape arithmetic).

Shapes in `infer` may hold symbolic dims (strings); where a result dim cannot be known it becomes a
fresh symbol "<node>:<axis>"."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..errors import ModelError
from ..kernels import spec
from ..plan import Push
from . import Op, attr, register
from ._util import broadcast_shapes, norm_axis

AFFINE, RESHAPE, PAD = 0, 1, 2   # copy.comp modes


def int_list(a):
    return [int(v) for v in np.asarray(a).reshape(-1)]


def int_operand(node, xs, i, name=None):
    """Integers from input i (a constant), or from attribute `name` (older opsets); None if neither."""
    if len(node.inputs) > i and node.inputs[i]:
        return int_list(xs[i])
    v = attr(node, name) if name else None
    return None if v is None else [int(x) for x in v]


def _prod(dims):
    """Product of dims; symbolic factors are kept as a "2*batch*seq"-style string."""
    n, syms = 1, []
    for d in dims:
        if isinstance(d, int):
            n *= d
        else:
            syms.append(d)
    return n if not syms or n == 0 else "*".join(([str(n)] if n != 1 else []) + syms)


def _axes(node, axes, rank):
    out = [norm_axis(node, a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ModelError(f"{node}: repeated axes {axes}")
    return out


# -- lowering helpers -------------------------------------------------------------------------
def _copy(ctx, out, src, mode, start=(0, 0, 0, 0), step=(0, 0, 0, 0), perm=(0, 1, 2, 3), pad=None):
    """out from src on glsl/copy.comp in `mode`; pad: (pad mode, constant) for PAD."""
    p = Push().sizes(out).sizes(src).ivec4(*start).ivec4(*step).ivec4(*perm)
    p.ivec4(out.packed_dim, src.packed_dim, *([] if pad is None else [pad[0]]))
    if pad is not None:
        p.vec4(pad[1])
    ctx.dispatch("copy", [(out.name, "w"), (src.name, "r")], p, spec("copy", MODE=mode), out.texel_extents, "copy",
                 nbytes=8 * out.numel, axes={"storage": ctx.storage})


def view_or_copy(ctx, out, src):
    """out = src reshaped: a free view when the layouts agree, else a copy by row-major index."""
    if ctx.can_view(out, src):
        ctx.view(out, src)
    else:
        _copy(ctx, out, src, RESHAPE)


def affine_copy(ctx, out, src, amap):
    """amap[a] = (start, step, output axis) for each input axis a (ONNX order):
    in[a] = start + step * out[output axis]; output axis None for a fixed index (step 0)."""
    moved = [(s0, st, o, d) for (s0, st, o), d in zip(amap, src.shape) if d != 1]
    if (all(s0 == 0 for s0, _, _, _ in moved) and all(st == 1 and out.shape[o] == d for _, st, o, d in moved)
            and [o for _, _, o, _ in moved] == [i for i, d in enumerate(out.shape) if d != 1]):
        return view_or_copy(ctx, out, src)   # only size-1 dims move: the row-major order is unchanged
    rin, rout = len(src.shape), len(out.shape)
    start, step, perm = [0] * 4, [0] * 4, [0, 1, 2, 3]
    for a, (s0, st, o) in enumerate(amap):
        d = rin - 1 - a                      # ONNX axis -> WHCN dim
        start[d], step[d], perm[d] = s0, st, 0 if o is None else rout - 1 - o
    _copy(ctx, out, src, AFFINE, start, step, perm)


def concat(ctx, out, srcs, axis):
    """out = concatenation of srcs along ONNX axis `axis`; more than 4 inputs go through a tree."""
    srcs = [s for s in srcs if s.numel]
    if len(srcs) == 1:
        return view_or_copy(ctx, out, srcs[0])
    if len(srcs) > 4:
        parts = []
        for k in range(0, len(srcs), 4):
            group = srcs[k:k + 4]
            if len(group) > 1:
                shape = list(out.shape)
                shape[axis] = sum(s.shape[axis] for s in group)
                part = ctx.temp(f"{group[0].name}@cat", shape)   # a hint of its own: temp() probes names
                concat(ctx, part, group, axis)
                group = [part]
            parts += group
        return concat(ctx, out, parts, axis)
    slots = srcs + [srcs[0]] * (4 - len(srcs))
    p = Push().sizes(out)
    for s in slots:
        p.sizes(s)
    p.ivec4(*[s.packed_dim for s in slots]).ivec4(out.packed_dim, len(out.shape) - 1 - axis, len(srcs))
    ctx.dispatch("concat", [(out.name, "w")] + [(s.name, "r") for s in slots], p, (),
                 out.texel_extents, "copy", nbytes=8 * out.numel, axes={"storage": ctx.storage})


# -- ops ----------------------------------------------------------------------------------------
class ShapeOp(Op):
    consts = ()      # inputs that must be known at load time (target shapes, axes, slice bounds)

    def check(self, node, ins):
        for i in self.consts:
            if i < len(ins) and ins[i] is not None and not ins[i].is_const:
                return (f"input {i} ('{node.inputs[i]}') is computed at run time; minirt needs it to be a "
                        f"constant after load-time folding (static {node.op} only)")

    def infer(self, node, ins):
        xs = [None if t is None else t.data for t in ins]
        return [(self.out_shape(node, ins[0].shape, xs), ins[0].dtype)]

    def out_shape(self, node, shape, xs):
        raise NotImplementedError


class ReshapeLike(ShapeOp):
    """Ops that only relabel the shape: the row-major order of elements is unchanged."""

    def reference(self, node, x, *rest):
        return [x.reshape(self.out_shape(node, x.shape, [x, *rest]))]

    def lower(self, node, ctx):
        view_or_copy(ctx, ctx.t(node.outputs[0]), ctx.t(node.inputs[0]))


@register
class Reshape(ReshapeLike):
    name, consts = "Reshape", (1,)
    limits = "the target shape must be a constant after folding"

    def out_shape(self, node, shape, xs):
        target = int_list(xs[1])
        zero_copies = not attr(node, "allowzero", 0)
        if zero_copies and any(d == 0 and i >= len(shape) for i, d in enumerate(target)):
            raise ModelError(f"{node}: target {target} copies a dim the rank-{len(shape)} input does not have")
        out = [shape[i] if d == 0 and zero_copies else d for i, d in enumerate(target)]
        if out.count(-1) > 1:
            raise ModelError(f"{node}: target shape {target} has more than one -1")
        if -1 in out:   # what is left of the input after the other target dims; symbols cancel by name
            k = out.index(-1)
            num = _prod([d for d in shape if isinstance(d, int)])
            syms = Counter(d for d in shape if not isinstance(d, int))
            den, unknown = 1, False
            for d in out[:k] + out[k + 1:]:
                if isinstance(d, int):
                    den *= d
                elif syms[d]:
                    syms[d] -= 1
                else:
                    unknown = True
            if den == 0 or num % den:
                if not syms and not unknown:
                    raise ModelError(f"{node}: cannot reshape {list(shape)} to {target}")
                unknown = True
            out[k] = f"{node.name}:{k}" if unknown else _prod([num // den, *syms.elements()])
        elif all(isinstance(d, int) for d in shape) and _prod(out) != _prod(shape):
            raise ModelError(f"{node}: cannot reshape {list(shape)} ({_prod(shape)} elements) to {target}")
        return tuple(out)


@register
class Flatten(ReshapeLike):
    name = "Flatten"

    def out_shape(self, node, shape, xs):
        axis = int(attr(node, "axis", 1))
        a = axis + len(shape) if axis < 0 else axis
        if not 0 <= a <= len(shape):
            raise ModelError(f"{node}: axis {axis} is out of range for rank {len(shape)}")
        return (_prod(shape[:a]), _prod(shape[a:]))


@register
class Squeeze(ReshapeLike):
    name, consts = "Squeeze", (1,)
    limits = "axes given as an input (opset 13+) must be constants after folding"

    def out_shape(self, node, shape, xs):
        axes = int_operand(node, xs, 1, "axes")
        if axes is None:
            return tuple(d for d in shape if d != 1)
        axes = _axes(node, axes, len(shape))
        bad = [a for a in axes if isinstance(shape[a], int) and shape[a] != 1]
        if bad:
            raise ModelError(f"{node}: cannot squeeze axes {bad} of shape {list(shape)} (size is not 1)")
        return tuple(d for i, d in enumerate(shape) if i not in axes)


@register
class Unsqueeze(ReshapeLike):
    name, consts = "Unsqueeze", (1,)
    limits = "axes given as an input (opset 13+) must be constants after folding"

    def out_shape(self, node, shape, xs):
        axes = int_operand(node, xs, 1, "axes")
        if axes is None:
            raise ModelError(f"{node}: no axes given")
        rank = len(shape) + len(axes)
        axes = _axes(node, axes, rank)
        rest = iter(shape)
        return tuple(1 if i in axes else next(rest) for i in range(rank))


class Affine(ShapeOp):
    """Ops that are one affine gather copy: `mapping` gives the output shape and, per input axis,
    (start, step, output axis)."""

    def out_shape(self, node, shape, xs):
        return self.mapping(node, shape, xs)[0]

    def lower(self, node, ctx):
        src = ctx.t(node.inputs[0])
        xs = [ctx.graph.tensor(i).data if i else None for i in node.inputs]
        affine_copy(ctx, ctx.t(node.outputs[0]), src, self.mapping(node, src.shape, xs)[1])


@register
class Transpose(Affine):
    name = "Transpose"

    def _perm(self, node, rank):
        perm = [int(p) for p in attr(node, "perm", range(rank - 1, -1, -1))]
        if sorted(perm) != list(range(rank)):
            raise ModelError(f"{node}: perm {perm} is not a permutation of the {rank} axes")
        return perm

    def mapping(self, node, shape, xs):
        perm = self._perm(node, len(shape))
        return tuple(shape[p] for p in perm), [(0, 1, perm.index(a)) for a in range(len(shape))]

    def reference(self, node, x):
        return [np.transpose(x, self._perm(node, x.ndim))]


@register
class Slice(Affine):
    name, consts = "Slice", (1, 2, 3, 4)
    limits = "starts/ends/axes/steps must be constants after folding"

    def _args(self, node, rank, xs):
        starts, ends = int_operand(node, xs, 1, "starts"), int_operand(node, xs, 2, "ends")
        if starts is None or ends is None or len(starts) != len(ends):
            raise ModelError(f"{node}: starts {starts} and ends {ends} must be given with the same length")
        axes = int_operand(node, xs, 3, "axes" if len(node.inputs) == 1 else None) or list(range(len(starts)))
        steps = int_operand(node, xs, 4) or [1] * len(starts)
        if len(axes) != len(starts) or len(steps) != len(starts) or 0 in steps:
            raise ModelError(f"{node}: axes {axes} / steps {steps} do not match starts {starts} (or a step is 0)")
        return {a: (s, e, st) for a, s, e, st in zip(_axes(node, axes, rank), starts, ends, steps)}

    def mapping(self, node, shape, xs):
        args, out, amap = self._args(node, len(shape), xs), list(shape), []
        for a, d in enumerate(shape):
            if a not in args:
                amap.append((0, 1, a))
            elif isinstance(d, int):
                r = range(*slice(*args[a]).indices(d))   # numpy's clamping is ONNX's
                out[a] = len(r)
                amap.append((r.start, r.step, a))
            else:
                s, e, st = args[a]
                out[a] = d if (s, st) == (0, 1) and e >= 2 ** 31 - 1 else f"{node.name}:{a}"
                amap.append(None)                        # only needed once shapes are static
        return tuple(out), amap

    def reference(self, node, x, *rest):
        args = self._args(node, x.ndim, [x, *rest])
        return [x[tuple(slice(*args[a]) if a in args else slice(None) for a in range(x.ndim))].copy()]


@register
class Expand(Affine):
    name, consts = "Expand", (1,)
    limits = "the target shape must be a constant after folding"

    def mapping(self, node, shape, xs):
        out = broadcast_shapes(node, tuple(shape), tuple(int_list(xs[1])))
        off = len(out) - len(shape)
        return out, [(0, 0 if d == 1 and out[a + off] != 1 else 1, a + off) for a, d in enumerate(shape)]

    def reference(self, node, x, shape):
        return [np.broadcast_to(x, self.mapping(node, x.shape, [x, shape])[0]).copy()]


@register
class Gather(ShapeOp):
    name, consts = "Gather", (1,)
    limits = ("on the GPU: float32 data with constant indices (runs of evenly spaced indices become one copy "
              "each, joined by Concat), or indices computed at run time along axis 0 in buffer storage (an embedding "
              "lookup: the host checks them against the axis, an id out of range being an InputError as in "
              "onnxruntime, counts negative ones from the end and passes them as int32); elsewhere a Gather by "
              "indices computed from the inputs runs on the host")

    @staticmethod
    def runtime(ins) -> bool:
        return len(ins) > 1 and ins[1] is not None and not ins[1].is_const

    def check(self, node, ins):
        if not self.runtime(ins):
            return super().check(node, ins)
        if int(attr(node, "axis", 0)) != 0 or ins[1].dtype != "int32":
            return (f"indices computed at run time ('{node.inputs[1]}', {ins[1].dtype}) are supported as int32 "
                    f"along axis 0 only")
        return None

    def infer(self, node, ins):
        if self.runtime(ins):
            return [(tuple(ins[1].shape) + tuple(ins[0].shape[1:]), ins[0].dtype)]
        return super().infer(node, ins)

    def _idx(self, node, shape, indices):
        axis = norm_axis(node, int(attr(node, "axis", 0)), len(shape))
        idx = np.asarray(indices).astype(np.int64)
        d = shape[axis]
        if isinstance(d, int):
            if idx.size and (idx.min() < -d or idx.max() >= d):
                raise ModelError(f"{node}: indices out of range for axis {axis} of size {d}")
            idx = np.where(idx < 0, idx + d, idx)
        return axis, idx

    def out_shape(self, node, shape, xs):
        axis, idx = self._idx(node, shape, xs[1])
        return tuple(shape[:axis]) + idx.shape + tuple(shape[axis + 1:])

    def reference(self, node, x, indices):
        axis, idx = self._idx(node, x.shape, indices)
        return [np.take(x, idx, axis=axis)]

    def lower(self, node, ctx):
        out, src = ctx.t(node.outputs[0]), ctx.t(node.inputs[0])
        if not ctx.graph.tensor(node.inputs[1]).is_const:
            return gather_rows_at_run_time(ctx, node, out, src)
        axis, idx = self._idx(node, src.shape, ctx.graph.tensor(node.inputs[1]).data)
        if idx.ndim == 0:          # a fixed index; the axis disappears
            return affine_copy(ctx, out, src, [(int(idx), 0, None) if a == axis else (0, 1, a - (a > axis))
                                               for a in range(len(src.shape))])
        gather_const(ctx, out, src, axis, idx)


def gather_rows_at_run_time(ctx, node, out, src):
    """out = src's rows along axis 0 picked by the run-time int32 indices (input 1): one row copy by index."""
    from .state import _buffers, _width, copy_rows
    _buffers(ctx, node)
    idx = ctx.t(node.inputs[1])
    copy_rows(ctx, out, src, idx.numel, _width(src.shape), index=idx)


def gather_const(ctx, out, src, axis, idx):
    """out = np.take(src, idx, axis) for constant indices (non-negative, at least 1-D): each run of evenly spaced
    indices one affine copy, the runs joined by Concat."""
    rank = len(src.shape)
    flat = src.shape[:axis] + (idx.size,) + src.shape[axis + 1:]
    dst = out if idx.ndim == 1 else ctx.temp(f"{out.name}@flat", flat)
    runs = []                  # (first, step, count): evenly spaced indices
    for v in idx.reshape(-1).tolist():
        if runs and (runs[-1][2] == 1 or runs[-1][0] + runs[-1][1] * runs[-1][2] == v):
            f, s, n = runs[-1]
            runs[-1] = (f, v - f if n == 1 else s, n + 1)
        else:
            runs.append((v, 1, 1))
    parts = []
    for k, (f, s, n) in enumerate(runs):
        # one hint per run: temp() probes hint, hint#1, ... so thousands of runs sharing one hint
        # (shuffled indices) would make planning quadratic in their number
        part = dst if len(runs) == 1 else ctx.temp(f"{out.name}@run{k}", flat[:axis] + (n,) + flat[axis + 1:])
        affine_copy(ctx, part, src, [(f, s, a) if a == axis else (0, 1, a) for a in range(rank)])
        parts.append(part)
    if len(runs) > 1:
        concat(ctx, dst, parts, axis)
    if dst is not out:
        view_or_copy(ctx, out, dst)


@register
class GatherND(ShapeOp):
    name, consts = "GatherND", (1,)
    limits = ("float32 data with constant indices (any batch_dims: the slices become rows of one Gather), or "
              "indices computed at run time picking along axis 0 alone (last indices dim 1, batch_dims 0) in buffer "
              "storage, checked on the host as Gather's; elsewhere, by indices computed from the inputs, on the host")

    def check(self, node, ins):
        if not Gather.runtime(ins):
            return super().check(node, ins)
        shape = ins[1].shape
        if int(attr(node, "batch_dims", 0)) != 0 or ins[1].dtype != "int32" or not shape or shape[-1] != 1:
            return (f"indices computed at run time ('{node.inputs[1]}', {ins[1].dtype} {list(shape or [])}) are "
                    f"supported as int32 picking along axis 0 alone (last dim 1, batch_dims 0)")
        return None

    def infer(self, node, ins):
        b, data, idx = int(attr(node, "batch_dims", 0)), ins[0].shape, ins[1].shape
        q = idx[-1] if idx else None
        if not isinstance(q, int) or not 1 <= q <= len(data) - b or not 0 <= b < len(idx):
            raise ModelError(f"{node}: indices {list(idx)} with batch_dims {b} do not fit data {list(data)}")
        return [(tuple(data[:b]) + tuple(idx[b:-1]) + tuple(data[b + q:]), ins[0].dtype)]

    def _flat(self, node, shape, indices):
        """(rows, flat row indices): data viewed as [prod(batch dims) * prod(indexed dims), rest...], each index
        tuple's row in it (negative indices counted from the end)."""
        b, idx = int(attr(node, "batch_dims", 0)), np.asarray(indices).astype(np.int64)
        q, dims = idx.shape[-1], shape[b:b + idx.shape[-1]]
        nb = int(np.prod(shape[:b], dtype=np.int64))
        if tuple(idx.shape[:b]) != tuple(shape[:b]):
            raise ModelError(f"{node}: indices {list(idx.shape)} and data {list(shape)} differ in the batch dims")
        idx = idx.reshape(nb, -1, q)
        if idx.size and (np.any(idx < -np.array(dims)) or np.any(idx >= np.array(dims))):
            raise ModelError(f"{node}: indices out of range for dims {list(dims)}")
        local = np.ravel_multi_index(tuple(np.where(idx < 0, idx + dims, idx).transpose(2, 0, 1)), dims)
        per = int(np.prod(dims, dtype=np.int64))
        return nb * per, (local + np.arange(nb)[:, None] * per).reshape(-1)

    def reference(self, node, x, indices):
        b, q = int(attr(node, "batch_dims", 0)), np.shape(indices)[-1]
        rows, flat = self._flat(node, x.shape, indices)
        out = x.reshape((rows,) + x.shape[b + q:])[flat]
        return [out.reshape(x.shape[:b] + np.shape(indices)[b:-1] + x.shape[b + q:])]

    def lower(self, node, ctx):
        out, src = ctx.t(node.outputs[0]), ctx.t(node.inputs[0])
        if not ctx.graph.tensor(node.inputs[1]).is_const:
            return gather_rows_at_run_time(ctx, node, out, src)
        indices = ctx.graph.tensor(node.inputs[1]).data
        b, q = int(attr(node, "batch_dims", 0)), indices.shape[-1]
        rows, flat = self._flat(node, src.shape, indices)
        rest = tuple(src.shape[b + q:])
        rows_in = ctx.temp(f"{src.name}@rows", (rows,) + rest)
        view_or_copy(ctx, rows_in, src)
        if out.shape == (flat.size,) + rest:
            return gather_const(ctx, out, rows_in, 0, flat)
        rows_out = ctx.temp(f"{out.name}@rows", (flat.size,) + rest)
        gather_const(ctx, rows_out, rows_in, 0, flat)
        view_or_copy(ctx, out, rows_out)


@register
class Concat(ShapeOp):
    name = "Concat"
    limits = "up to 4 inputs per dispatch; more go through a tree of dispatches"

    def infer(self, node, ins):
        shapes = [t.shape for t in ins if t is not None]
        axis = norm_axis(node, int(attr(node, "axis")), len(shapes[0]))
        if any(len(s) != len(shapes[0]) for s in shapes):
            raise ModelError(f"{node}: inputs of different ranks {[list(s) for s in shapes]}")
        out = list(shapes[0])
        for i, dims in enumerate(zip(*shapes)):
            if i == axis:
                ints = sum(d for d in dims if isinstance(d, int))
                syms = [d for d in dims if not isinstance(d, int)]
                out[i] = "+".join(([str(ints)] if ints else []) + syms) if syms else ints
            else:
                out[i] = next((d for d in dims if isinstance(d, int)), dims[0])
        return [(tuple(out), ins[0].dtype)]

    def reference(self, node, *xs):
        return [np.concatenate(xs, axis=int(attr(node, "axis")))]

    def lower(self, node, ctx):
        out = ctx.t(node.outputs[0])
        concat(ctx, out, [ctx.t(i) for i in node.inputs], norm_axis(node, int(attr(node, "axis")), len(out.shape)))
