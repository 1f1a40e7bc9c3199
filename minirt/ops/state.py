"""Ops for programs that keep state across runs (Graph.state) and read run-time parameters (Graph.params): row copies
whose rows come from an int32 tensor or a parameter (glsl/copy_rows.comp), and attention over a key/value cache
whose length is a parameter (glsl/cached_attention.comp). A parameter is an int32 scalar of the Plan's parameter
block, which the host writes before each submission: the recorded command buffer is replayed as it is.

All minirt-domain ops (made by a graph builder, such as minirt/whisper/decoder_graph.py), buffer storage, at fp32 and
at fp16 (the kernels' half variants: 16-bit storage of tensors and state, fp32 arithmetic):
  ParamRows(table) [param p, rows R, per_row]  out[i] = table[param(p) + i], i < R (a positional embedding); per_row:
                                               table[param(p + i)] (the parameters after p are the slots that follow
                                               it: each row of a batch at its own position)
  CacheWrite(cache, x) [param p, per_row, axis] out = cache with out[b, param(p) + t] = x[b, t] (in place where out is
                                               the new value of the state `cache`: only x's rows are written); per_row:
                                               at param(p + b); axis 0: x's items at cache's items from param(p) / T
                                               on, T = the cache's axis 1 (param(p) counts its [B * T] rows: a chunk
                                               of a batch written into the batch's state; rows past it are dropped)
  ReorderRows(x, rows) [param valid]           out[i] = x[rows[i]] for i < len(rows), rows beyond unchanged (in place,
                                               through a scratch copy; only the first param(valid) entries of axis 1)
  CachedAttention(q, k, v) [heads, scale, param p, offset o, per_row, items i]
                                               softmax(scale q k^T) v per head over keys 0 .. param(p) + o + t of
                                               query t (causal over a growing cache; per_row: param(p + b) for batch
                                               row b), or every key without p; K and V may have one batch row shared
                                               by all query rows, or more rows than q (a cache of max_batch rows read
                                               by a step of fewer), or, with items, K/V row param(i + b) for query row
                                               b (each sequence of a batch reads its own encoder output)
The runtime Gather (ONNX Gather with int32 indices computed at run time, minirt/ops/shape_ops.py) uses the same
row copy."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError, UnsupportedError
from ..kernels import attention_cached, spec
from ..kernels.attention_cached import ATTENTION_MAX_DH
from ..plan import Push
from . import Op, attr, register


def _width(shape, axis=1) -> int:
    return int(np.prod(shape[axis:], dtype=np.int64))


def _buffers(ctx, node):
    if ctx.storage != "buffer":
        raise UnsupportedError(f"{node} runs in buffer storage only (this plan: {ctx.storage})")


def copy_rows(ctx, out, src, rows, width, *, index=None, src_param=None, group=None, dst_stride=0, dst_param=None,
              cols_param=None, cols_unit=0, per_row=False):
    """glsl/copy_rows.comp: for r < rows, out[dst_row(r)][c] = src[src_row(r)][c] over rows of `width` elements.
    src_row: index[r] (an int32 tensor), param(src_param) + r (per_row: param(src_param + r)), or r. dst_row:
    (r // group) * dst_stride + param(dst_param) + r % group (per_row: param(dst_param + r // group); group=None: r).
    Only the first param(cols_param) * cols_unit elements of each row where cols_param is given. per_row reads the
    parameters in the slots after the named one."""
    slot = (lambda name: -1 if name is None else ctx.param(name))
    vec = width % 4 == 0 and (cols_param is None or cols_unit % 4 == 0)
    q = 4 if vec else 1
    mode = 0 if index is not None else (3 if per_row else 1) if src_param is not None else 2
    block = ctx.params_block()
    p = (Push().ivec4(rows, width // q, src.numel // width, mode)
         .ivec4(slot(src_param), group or rows, dst_stride if group else 0, slot(dst_param))
         .ivec4(slot(cols_param), cols_unit // q, out.numel // width, int(per_row and dst_param is not None)))
    ctx.dispatch("copy_rows", [(out.name, "w"), (src.name, "r"), ((index or src).name, "r"), (block.name, "r")],
                 p, spec("copy_rows", VEC4=vec), (width // q, rows, 1), "copy", nbytes=8 * rows * width)


def _same_memory(ctx, a, b) -> bool:
    return ctx.plan.root(a.name) == ctx.plan.root(b.name) and ctx.plan.byte_offset(a.name) == \
        ctx.plan.byte_offset(b.name)


class _ParamOp(Op):
    domain = "minirt"

    def fold(self, node, ins):
        return None      # depends on run-time parameters or state: never known at load time


@register
class ParamRows(_ParamOp):
    name = "ParamRows"
    limits = "internal: rows of a constant at a run-time offset (a parameter); buffers"

    def infer(self, node, ins):
        t = ins[0].shape
        return [((int(attr(node, "rows", 1)),) + tuple(t[1:]), ins[0].dtype)]

    def reference(self, node, table, offset=0):
        """(offset: the parameter's value; per_row: the values of the rows' parameters)"""
        rows = int(attr(node, "rows", 1))
        if attr(node, "per_row", 0):
            return [table[np.asarray(offset, np.int64).reshape(-1)[:rows]]]
        return [table[offset:offset + rows]]

    def lower(self, node, ctx):
        _buffers(ctx, node)
        out, table = ctx.t(node.outputs[0]), ctx.t(node.inputs[0])
        copy_rows(ctx, out, table, out.shape[0], _width(table.shape), src_param=attr(node, "param"),
                  per_row=bool(attr(node, "per_row", 0)))


@register
class CacheWrite(_ParamOp):
    name = "CacheWrite"
    limits = "internal: rows written into a cache at a run-time position; buffers"

    def infer(self, node, ins):
        c, x = ins[0].shape, ins[1].shape
        if int(attr(node, "axis", 1)) == 0 and len(c) >= 2 and len(x) == len(c) and x[0] <= c[0] and \
                tuple(x[1:]) == tuple(c[1:]) and not attr(node, "per_row", 0):
            return [(c, ins[0].dtype)]
        if len(c) < 2 or len(x) != len(c) or x[0] > c[0] or x[1] > c[1] or tuple(x[2:]) != tuple(c[2:]):
            raise ModelError(f"{node}: writes x {list(x)} into a cache {list(c)} (same rank >= 2, the same "
                             f"trailing dims, at most its rows)")
        return [(c, ins[0].dtype)]

    def reference(self, node, cache, x, offset=0):
        """(offset: the parameter's value; per_row: one a row of x)"""
        y = cache.copy()
        if int(attr(node, "axis", 1)) == 0:
            rows = y.reshape((-1,) + y.shape[2:])
            part = x.reshape((-1,) + x.shape[2:])[:max(0, len(rows) - offset)]
            rows[offset:offset + len(part)] = part
            return [y]
        offsets = np.broadcast_to(np.asarray(offset, np.int64).reshape(-1), (x.shape[0],)) if \
            attr(node, "per_row", 0) else [offset] * x.shape[0]
        for b, o in enumerate(offsets):
            y[b, o:o + x.shape[1]] = x[b]
        return [y]

    def lower(self, node, ctx):
        _buffers(ctx, node)
        out, cache, x = ctx.t(node.outputs[0]), ctx.t(node.inputs[0]), ctx.t(node.inputs[1])
        width = _width(x.shape, 2)
        if not _same_memory(ctx, out, cache):      # not in place: start from a copy of the cache
            copy_rows(ctx, out, cache, cache.shape[0], _width(cache.shape))
        if int(attr(node, "axis", 1)) == 0:        # x's [B * T] rows at row param(p) of the cache's
            return copy_rows(ctx, out, x, x.shape[0] * x.shape[1], width, dst_param=attr(node, "param"))
        copy_rows(ctx, out, x, x.shape[0] * x.shape[1], width, group=x.shape[1], dst_stride=cache.shape[1],
                  dst_param=attr(node, "param"), per_row=bool(attr(node, "per_row", 0)))


@register
class ReorderRows(_ParamOp):
    name = "ReorderRows"
    limits = "internal: rows gathered by a run-time int32 index tensor, in place (beam reordering); buffers"

    def infer(self, node, ins):
        x, r = ins[0].shape, ins[1].shape
        if len(x) < 2 or len(r) != 1 or r[0] > x[0] or ins[1].dtype != "int32":
            raise ModelError(f"{node}: reorders x {list(x)} (rank >= 2) by int32 rows [n <= {x[0]}], got "
                             f"{list(r)} {ins[1].dtype}")
        return [(x, ins[0].dtype)]

    def reference(self, node, x, rows):
        y = x.copy()
        y[:len(rows)] = x[np.asarray(rows, np.int64)]
        return [y]

    def lower(self, node, ctx):
        _buffers(ctx, node)
        out, x, rows = ctx.t(node.outputs[0]), ctx.t(node.inputs[0]), ctx.t(node.inputs[1])
        n, width, unit = rows.shape[0], _width(x.shape), _width(x.shape, 2)
        valid = attr(node, "valid")
        if not _same_memory(ctx, out, x):
            copy_rows(ctx, out, x, x.shape[0], width)
        tmp = ctx.temp(f"{out.name}@gathered", (n,) + tuple(x.shape[1:]))
        copy_rows(ctx, tmp, x, n, width, index=rows, cols_param=valid, cols_unit=unit)
        copy_rows(ctx, out, tmp, n, width, cols_param=valid, cols_unit=unit)


@register
class CachedAttention(_ParamOp):
    name = "CachedAttention"
    limits = (f"internal: attention over a key/value cache, causal over a run-time length or over every key; head "
              f"dim up to {ATTENTION_MAX_DH}; buffers")

    def infer(self, node, ins):
        q, k, v = (t.shape for t in ins)
        items = bool(attr(node, "items", ""))
        if (len(q) != 3 or len(k) != 3 or k != v or not (items or k[0] == 1 or k[0] >= q[0]) or q[2] != k[2]
                or q[2] % int(attr(node, "heads", 1))):
            raise ModelError(f"{node}: expects q [B, Tq, D], k and v [1 or at least B, Tk, D] (D divisible by the "
                             f"heads), got {list(q)} {list(k)} {list(v)}")
        return [(q, ins[0].dtype)]

    def check(self, node, ins):
        d = ins[0].shape[-1] if ins[0].shape else None
        if isinstance(d, int):
            dh = d // int(attr(node, "heads", 1))
            if dh > ATTENTION_MAX_DH or dh % 4:
                return f"head dim {dh} is not a multiple of 4 up to {ATTENTION_MAX_DH}"
        return None

    def reference(self, node, q, k, v, offset=None, items=None):
        """offset: the parameter's value plus the offset attribute (None: every key; per_row: one a row of q, [B]);
        items: the K/V row of each row of q ([B], with the items attribute)."""
        h, scale = int(attr(node, "heads", 1)), float(attr(node, "scale", 1.0))
        B, Tq, D = q.shape
        if items is not None:
            k, v = (x[np.asarray(items, np.int64).reshape(-1)[:B]] for x in (k, v))
        k, v = (np.broadcast_to(x, (B,) + x.shape[1:]) if x.shape[0] == 1 else x[:B] for x in (k, v))

        def split(x):
            return x.reshape(x.shape[0], x.shape[1], h, -1).transpose(0, 2, 1, 3)

        s = split(q) @ split(k).transpose(0, 1, 3, 2) * np.float32(scale)
        if offset is not None:
            keys = np.arange(k.shape[1])[None, None, None, :]
            last = np.asarray(offset).reshape(-1, 1, 1, 1) + np.arange(Tq)[None, None, :, None]
            s = np.where(keys <= last, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        o = (e / e.sum(-1, keepdims=True)) @ split(v)
        return [o.transpose(0, 2, 1, 3).reshape(q.shape).astype(q.dtype, copy=False)]

    def lower(self, node, ctx):
        _buffers(ctx, node)
        attention_cached.lower(node, ctx)
