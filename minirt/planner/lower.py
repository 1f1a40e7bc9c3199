"""Lowering: graph nodes -> dispatches, through each op's `lower` method.

LowerCtx is what an op sees: tensor specs in the chosen storage and layout, helpers to add
prepacked weights, temporaries, free views and dispatches. It knows nothing about Vulkan.

precision="fp16": every tensor an op sees is float16 in GPU memory and every dispatch runs the kernel's
`_half` variant (16-bit loads and stores, fp32 arithmetic). The graph's inputs and outputs stay float32 for
the host: lowering adds a cast after each input and before each output, so ops never see a mixed case."""
from __future__ import annotations

import numpy as np

from .. import ops
from ..errors import UnsupportedError
from .plan import (CONSTANT, INPUT, INTERMEDIATE, OUTPUT, SCRATCH, WEIGHT, Dispatch, Plan, Push,
                   TensorSpec, as_dtype)
from .storage_layout import packed_dim_for


class LowerCtx:
    def __init__(self, graph, storage: str, profile, options=None, precision="fp32"):
        self.graph = graph
        self.storage = storage
        self.profile = profile
        self.options = options or {}
        self.half = precision == "fp16"
        self.dtype = "float16" if self.half else "float32"    # of every tensor an op sees
        self.plan = Plan(storage=storage, inputs=list(graph.inputs), outputs=list(graph.outputs),
                         notes={k: list(v) for k, v in graph.notes.items()}, precision=precision)
        self.node = None
        self.alias = {}       # fp16: graph input/output name -> the float16 tensor ops use in its place
        self.alias_outputs = self.half   # off once the ops are lowered: the final casts write the float32 outputs

    # -- tensors --------------------------------------------------------------------------
    def t(self, name: str) -> TensorSpec:
        """The spec of a graph tensor, created on first use with its role, storage and layout."""
        if name in self.alias:
            return self.plan.tensors[self.alias[name]]
        if (self.alias_outputs and name in self.graph.outputs and name not in self.plan.tensors
                and not self.graph.tensor(name).is_const):
            self.alias[name] = self.temp(f"{name}@f16", self._graph_shape(name)).name
            return self.plan.tensors[self.alias[name]]
        spec = self.plan.tensors.get(name)
        if spec is not None:
            return spec
        gt = self.graph.tensor(name)
        if not gt.is_static:
            raise UnsupportedError(f"{self.graph.source}: tensor '{name}' has no static shape ({gt.shape})")
        if gt.dtype not in ("float32", None) and not gt.is_const:
            raise UnsupportedError(f"{self.graph.source}: tensor '{name}' is {gt.dtype}; minirt runs float32 tensors "
                                   f"on the GPU (integer tensors must be shape arithmetic that folds at load)")
        role = (INPUT if name in self.graph.inputs else OUTPUT if name in self.graph.outputs
                else CONSTANT if gt.is_const else INTERMEDIATE)
        shape = tuple(gt.shape)
        if len(shape) > 4:
            raise UnsupportedError(f"{self.graph.source}: tensor '{name}' has rank {len(shape)}; kernels take rank <= 4")
        data = np.ascontiguousarray(gt.data, np.float32) if gt.is_const else None
        dtype = "float32" if role in (INPUT, OUTPUT) else self.dtype
        spec = TensorSpec(name, shape, role, self.storage, packed_dim_for(shape, self.storage), data, dtype=dtype)
        self.plan.tensors[name] = spec
        return spec

    def _graph_shape(self, name):
        gt = self.graph.tensor(name)
        if not gt.is_static:
            raise UnsupportedError(f"{self.graph.source}: tensor '{name}' has no static shape ({gt.shape})")
        return tuple(gt.shape)

    def weight(self, name: str, data: np.ndarray) -> TensorSpec:
        """A prepacked weight: a read-only vec4 storage buffer in both storage modes (float16 at fp16,
        saturated to the fp16 range rather than overflowing to inf)."""
        data = np.ascontiguousarray(data, np.float32).reshape(-1)
        if data.size % 4:
            data = np.pad(data, (0, 4 - data.size % 4))
        data = as_dtype(data, self.dtype)
        key = f"{name}@packed"
        spec = TensorSpec(key, (data.size,), WEIGHT, "buffer", 0, data, dtype=self.dtype)
        self.plan.tensors[key] = spec
        return spec

    def temp(self, hint: str, shape, role=INTERMEDIATE, dtype=None) -> TensorSpec:
        name, i = hint, 0
        while name in self.plan.tensors or name in self.graph.tensors:
            i += 1
            name = f"{hint}#{i}"
        spec = TensorSpec(name, tuple(shape), role, self.storage, packed_dim_for(shape, self.storage),
                          dtype=dtype or self.dtype)
        self.plan.tensors[name] = spec
        return spec

    def scratch(self, name: str, floats: int, dtype="float32") -> TensorSpec:
        """One scratch buffer per name, shared by every user (sized for the largest): consecutive
        users reuse it, and barriers between them come from the executor's hazard tracking.
        `floats` counts elements of `dtype` (float32 unless the kernel writes the activation type)."""
        spec = self.plan.tensors.get(name)
        if spec is None:
            spec = TensorSpec(name, (floats,), SCRATCH, "buffer", 0, dtype=dtype)
            self.plan.tensors[name] = spec
        elif spec.shape[0] < floats:
            spec.shape = (floats,)
        return spec

    def can_view(self, dst: TensorSpec, src: TensorSpec) -> bool:
        """A reshape is free when both shapes put every element at the same place in memory."""
        root = self.plan.tensors[self.plan.root(src.name)].role   # src may itself be a view of an input
        if root == CONSTANT or dst.role == OUTPUT and root == INPUT:
            return False
        if self.storage == "buffer":
            return True
        return (dst.packed_dim == src.packed_dim and dst.texel_extents == src.texel_extents
                and (dst.whcn[:2] == src.whcn[:2] if dst.packed_dim == 0 else dst.whcn[:3] == src.whcn[:3]))

    def view(self, dst: TensorSpec, src: TensorSpec, offset: int = 0) -> None:
        """dst shares src's memory from element `offset` on (an offset only in buffer storage, where the
        executor binds the root's buffer at root offset + offset bytes: the caller keeps that byte offset a
        multiple of the device's minStorageBufferOffsetAlignment)."""
        if offset and (self.storage != "buffer" or dst.storage != "buffer"):
            raise UnsupportedError(f"a view at an offset ('{dst.name}' in '{src.name}') needs buffer storage")
        if offset < 0 or offset + dst.numel > src.numel:
            raise UnsupportedError(f"view '{dst.name}' at element {offset} runs past '{src.name}'")
        dst.view_of = src.name
        dst.view_offset = int(offset)

    # -- dispatches -------------------------------------------------------------------------
    def variant(self, base: str) -> str:
        return f"{base}_{self.storage}"

    def dispatch(self, kernel, args, push=b"", spec=(), global_size=(1, 1, 1), family="elementwise",
                 flops=0, nbytes=0, exact_kernel=False):
        """Adds a dispatch of `kernel` (its `_half` variant at fp16, unless exact_kernel)."""
        if self.half and not exact_kernel:
            kernel += "_half"
            nbytes //= 2
        node = self.node
        d = Dispatch(kernel=kernel, node=node.name if node else "", op=node.op if node else "",
                     args=list(args), push=push.bytes() if isinstance(push, Push) else push,
                     spec=tuple(int(s) for s in spec), global_size=tuple(int(g) for g in global_size),
                     family=family, flops=int(flops), bytes=int(nbytes))
        self.plan.dispatches.append(d)
        return d

    def note(self, text: str) -> None:
        self.plan.notes.setdefault(self.node.name, []).append(text)


def lower(graph, storage, profile, options=None, precision="fp32") -> Plan:
    ctx = LowerCtx(graph, storage, profile, options, precision)
    for name in graph.inputs:
        x = ctx.t(name)
        if ctx.half:    # ops read the float16 copy
            ctx.alias[name] = _cast(ctx, x, ctx.temp(f"{name}@f16", x.shape), "down").name
    for node in graph.nodes:
        ctx.node = node
        ops.get(node.op, node.domain).lower(node, ctx)
    ctx.node = None
    if ctx.half:
        ctx.alias_outputs = False
        for name in graph.outputs:
            src = ctx.t(name)
            del ctx.alias[name]
            _cast(ctx, src, ctx.t(name), "up")
    _check_outputs(ctx)
    return ctx.plan


def _cast(ctx, src, dst, direction):
    """dst = src converted float32 -> float16 ("down") or back ("up"); same shape, storage and layout."""
    p = Push().sizes(dst).ivec4(dst.packed_dim)
    ctx.dispatch(f"cast_{ctx.storage}_{direction}", [(dst.name, "w"), (src.name, "r")], p, (), dst.texel_extents,
                 "elementwise", nbytes=6 * dst.numel, exact_kernel=True)
    return dst


def _check_outputs(ctx: LowerCtx) -> None:
    for name in ctx.plan.outputs:
        if ctx.half:     # the output's value is what the cast reads
            name = next(d.reads[0] for d in ctx.plan.dispatches if name in d.writes)
        if ctx.plan.tensors[ctx.plan.root(name)].role in (INPUT, CONSTANT):
            raise UnsupportedError(f"{ctx.graph.source}: graph output '{name}' is a graph input or a constant; "
                                   f"minirt needs every output to be computed by a node")
