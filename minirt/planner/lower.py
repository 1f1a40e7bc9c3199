"""Lowering: graph nodes -> dispatches, through each op's `lower` method.

LowerCtx is what an op sees: tensor specs in the chosen storage and layout, helpers to add
prepacked weights, temporaries, free views and dispatches. It knows nothing about Vulkan.

precision="fp16": every tensor an op makes is float16 in GPU memory and every dispatch runs the kernel's
`_half` variant (16-bit loads and stores, fp32 arithmetic). The graph's inputs and outputs stay float32 for
the host, and the kernels at those edges convert them where they can (LowerCtx.dispatch, its `io`): a graph
input is read as float32 by texture kernels (samplers convert any format) and by `_in32` variants, a graph
output written as float32 by `_out32` variants. Elsewhere a cast dispatch stands between: a float16 copy of
the input made before its first reader, or a float16 stand-in for the output converted after the last dispatch."""
from __future__ import annotations

import weakref

import numpy as np

from .. import ops
from ..errors import UnsupportedError
from ..kernels import variant
from ..plan import (CONSTANT, INPUT, INTERMEDIATE, OUTPUT, PARAMS, PARAMS_MAX, PARAMS_TENSOR, SCRATCH, STATE,
                   WEIGHT, Dispatch, Plan, Push, TensorSpec, as_dtype)
from . import storage_layout
from .storage_layout import packed_dim_for


class Packs:
    """The packed weights of one planning call, each made once: the plans of a program (a Whisper batch's encoder
    entry points, one a window count, each packing the whole encoder) pack the same weights over and over. A packing
    is keyed by what decides it: the packing and its parameters, the arrays it packs by content, the element type;
    every plan that asks for it gets the same array object, so equal weights are found by identity when a program
    uploads them. An array is known by identity once seen; a new one by a sample of its elements, then bit for bit
    against the first array of that sample (a plan's merged sibling weights are new arrays, equal to the last plan's).
    It lives as long as the call (make_plan's `packs`): it holds what the call's plans hold, and the first array of
    each content it was given."""

    SAMPLE = 64     # elements of an array that pick the arrays it is compared with

    def __init__(self):
        self._made = {}
        self._known = {}       # id(array) -> (a weak reference to it, its token)
        self._firsts = {}      # (dtype, shape, sample bytes) -> [(array, token)]

    def once(self, key: tuple, make):
        """make(), or what it returned for an equal key before (key: hashables and numpy arrays)."""
        key = tuple(self.token(x) if isinstance(x, np.ndarray) else x for x in key)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = make()
        return made

    def token(self, a: np.ndarray) -> tuple:
        """The same tuple for arrays of the same dtype, shape and bits."""
        seen = self._known.get(id(a))
        if seen is not None and seen[0]() is a:
            return seen[1]
        at = np.linspace(0, a.size - 1, min(a.size, self.SAMPLE)).astype(np.int64)
        sample = (a.dtype.str, a.shape, a[np.unravel_index(at, a.shape)].tobytes() if a.ndim else a.tobytes())
        firsts = self._firsts.setdefault(sample, [])
        bits = f"u{a.itemsize}" if a.itemsize in (1, 2, 4, 8) else None
        for b, tok in firsts:
            if np.array_equal(a.view(bits), b.view(bits)) if bits else a.tobytes() == b.tobytes():
                break
        else:
            tok = (*sample, len(firsts))
            firsts.append((a, tok))
        self._known[id(a)] = (weakref.ref(a), tok)
        return tok


class LowerCtx:
    def __init__(self, graph, storage: str, profile, options=None, precision="fp32", node_storage=None, packs=None):
        self.graph = graph
        self.packs = Packs() if packs is None else packs    # packed weights shared with the call's other plans
        self.storage = storage      # the current node's (mixed storage: the plan's, or node_storage's)
        # mixed storage (storage_layout.py): node name -> the storage it runs in where not the plan's
        self.node_storage = dict(node_storage or {})
        self.copies = {}            # (tensor, storage) -> its copy in that storage, for nodes of the other
        self.made_by = {}           # tensor -> the node whose lowering made it (mixed storage: what to move)
        self.profile = profile
        self.options = options
        self.half = precision == "fp16"
        self.dtype = "float16" if self.half else "float32"    # of every tensor an op makes
        self.plan = Plan(storage=storage, inputs=list(graph.inputs), outputs=list(graph.outputs),
                         notes={k: list(v) for k, v in graph.notes.items()}, precision=precision)
        self.node = None
        # fp16 (see _edges): float32 graph input (or view of one) -> its float16 copy; graph output -> the float16
        # stand-in ops write instead (a final cast writes the output); outputs written as float32 by a kernel
        self.half_inputs, self.half_outputs, self.direct_outputs = {}, {}, set()
        self.consumers = graph.consumers()      # tensor -> the nodes that read it
        self.read_by_nodes = set(self.consumers)
        # state: the new value of a state tensor lives in its memory (a view of it from the start)
        self.state_of = {new: name for name, new in graph.state.items() if new != name}
        if (graph.state or graph.params) and storage != "buffer":
            raise UnsupportedError(f"{graph.source}: state tensors and run-time parameters need buffer storage (this "
                                   f"plan: {storage})")
        self.plan.state = list(graph.state)
        if len(graph.params) > PARAMS_MAX:
            raise UnsupportedError(f"{graph.source}: {len(graph.params)} run-time parameters; a parameter block "
                                   f"holds {PARAMS_MAX}")
        self.plan.params = list(graph.params)

    def read_by_op(self, name: str, op: str) -> bool:
        """Whether a graph node of type `op` reads tensor `name` (for a lowering that depends on what comes next)."""
        return any(n.op == op for n in self.consumers.get(name, ()))

    # -- tensors --------------------------------------------------------------------------
    def t(self, name: str) -> TensorSpec:
        """The spec of a graph tensor, created on first use with its role, storage and layout. At fp16 a graph output
        that nodes also read is their float16 stand-in from the start (see _edges). Mixed storage: a tensor made in the
        other storage comes as its copy in this node's (in_storage)."""
        spec = self._graph_tensor(name)
        if spec.storage != self.storage and spec.role in (INPUT, OUTPUT, INTERMEDIATE, CONSTANT):
            return self.in_storage(spec)
        return spec

    def _graph_tensor(self, name: str) -> TensorSpec:
        if name in self.half_outputs:
            return self.plan.tensors[self.half_outputs[name]]
        spec = self.plan.tensors.get(name)
        if spec is not None:
            return spec
        gt = self.graph.tensor(name)
        if not gt.is_static:
            raise UnsupportedError(f"{self.graph.source}: tensor '{name}' has no static shape ({gt.shape})")
        integer_input = gt.dtype == "int32" and name in self.graph.inputs
        if gt.dtype not in ("float32", None) and not gt.is_const and not integer_input:
            raise UnsupportedError(f"{self.graph.source}: tensor '{name}' is {gt.dtype}; minirt runs float32 tensors "
                                   f"on the GPU, and int32 graph inputs (integer tensors must otherwise be shape "
                                   f"arithmetic that folds at load)")
        if integer_input and self.storage != "buffer":
            raise UnsupportedError(f"{self.graph.source}: int32 input '{name}' needs buffer storage")
        role = (INPUT if name in self.graph.inputs else OUTPUT if name in self.graph.outputs
                else STATE if name in self.graph.state else CONSTANT if gt.is_const else INTERMEDIATE)
        shape = tuple(gt.shape)
        if len(shape) > 4:
            raise UnsupportedError(f"{self.graph.source}: tensor '{name}' has rank {len(shape)}; kernels take rank <= 4")
        data = np.ascontiguousarray(gt.data, np.float32) if gt.is_const else None
        # float32 where the host reads or writes it; state tensors, which only kernels touch, as activations
        dtype = "int32" if integer_input else "float32" if role in (INPUT, OUTPUT) else self.dtype
        spec = TensorSpec(name, shape, role, self.storage, packed_dim_for(shape, self.storage), data, dtype=dtype)
        self.plan.tensors[name] = spec
        self.made_by[name] = self.node.name if self.node else None
        if name in self.state_of:         # a state's new value: written where the state lives
            st = self.t(self.state_of[name])
            if st.shape != shape:
                raise UnsupportedError(f"{self.graph.source}: '{name}', the new value of state '{st.name}' "
                                       f"{list(st.shape)}, has shape {list(shape)}")
            spec.view_of, spec.dtype = st.name, st.dtype
        if self.half and role == OUTPUT and name in self.read_by_nodes:
            return self.plan.tensors[self._half_output(name)]
        return spec

    def weight(self, name: str, data, dtype: str | None = None, key: tuple | None = None) -> TensorSpec:
        """A prepacked weight: a read-only vec4 storage buffer in both storage modes (float16 at fp16,
        saturated to the fp16 range rather than overflowing to inf). dtype: the element type a kernel reads where it
        is not the plan's: "float32" at every precision for a table of indices and weights that fp16 would round,
        "float16" for the parts of a split fp32 weight. key: data is then a function making the array, called once
        for an equal key in the planning call (Packs.once: key names the packing, its parameters and the arrays it
        packs); the spec holds the array an earlier plan or node of the call made."""
        dtype = dtype or self.dtype

        def make(d):
            d = np.ascontiguousarray(d, np.float32).reshape(-1)
            if d.size % 4:
                d = np.pad(d, (0, 4 - d.size % 4))
            return as_dtype(d, dtype)
        data = make(data) if key is None else self.packs.once((*key, dtype), lambda: make(data()))
        key = f"{name}@packed"
        spec = TensorSpec(key, (data.size,), WEIGHT, "buffer", 0, data, dtype=dtype)
        self.plan.tensors[key] = spec
        return spec

    def temp(self, hint: str, shape, role=INTERMEDIATE, dtype=None, storage=None) -> TensorSpec:
        name, i = hint, 0
        while name in self.plan.tensors or name in self.graph.tensors:
            i += 1
            name = f"{hint}#{i}"
        storage = storage or self.storage
        spec = TensorSpec(name, tuple(shape), role, storage, packed_dim_for(shape, storage), dtype=dtype or self.dtype)
        self.plan.tensors[name] = spec
        self.made_by[name] = self.node.name if self.node else None
        return spec

    def in_storage(self, src: TensorSpec) -> TensorSpec:
        """Mixed storage: `src` in this node's storage. A constant is uploaded in both storages; anything else is
        copied by a dispatch at its first reader in this storage (the copy is shared by the later ones)."""
        key = (src.name, self.storage)
        if key in self.copies:
            return self.plan.tensors[self.copies[key]]
        if src.dtype == "int32":
            raise UnsupportedError(f"int32 tensor '{src.name}' lives in buffers")
        if src.role == CONSTANT:
            copy = self.temp(f"{src.name}@{self.storage}", src.shape, CONSTANT, src.dtype)
            copy.data = src.data
        else:
            copy = self.temp(f"{src.name}@{self.storage}", src.shape)
            _copy_storage(self, src, copy)
        self.copies[key] = copy.name
        return copy

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
        if dst.view_of or dst.role == STATE:     # already placed: a state's new value lives in the state
            return False
        if dst.storage != src.storage:
            return False
        if dst.storage == "buffer":
            return True
        return (dst.packed_dim == src.packed_dim and dst.texel_extents == src.texel_extents
                and (dst.whcn[:2] == src.whcn[:2] if dst.packed_dim == 0 else dst.whcn[:3] == src.whcn[:3]))

    def view(self, dst: TensorSpec, src: TensorSpec, offset: int = 0) -> None:
        """dst shares src's memory from element `offset` on (an offset only in buffer storage, where the
        executor binds the root's buffer at root offset + offset bytes: the caller keeps that byte offset a
        multiple of the device's minStorageBufferOffsetAlignment)."""
        if offset and (src.storage != "buffer" or dst.storage != "buffer"):
            raise UnsupportedError(f"a view at an offset ('{dst.name}' in '{src.name}') needs buffer storage")
        if offset < 0 or offset + dst.numel > src.numel:
            raise UnsupportedError(f"view '{dst.name}' at element {offset} runs past '{src.name}'")
        if dst.role == OUTPUT and dst.dtype != src.dtype:    # fp16: a float32 output cannot share float16 memory
            dst = self.plan.tensors[self._half_output(dst.name)]
        dst.view_of = src.name
        dst.view_offset = int(offset)
        dst.dtype = src.dtype      # what the memory holds: a view of a graph input is float32 at fp16 too

    def param(self, name: str) -> int:
        """The slot of run-time parameter `name` in the parameter block (Plan.params); a dispatch that reads it binds
        params_block() and passes the slot in its push constants."""
        if name not in self.plan.params:
            raise UnsupportedError(f"{self.node}: run-time parameter '{name}' is not declared by the graph "
                                   f"(graph.params: {self.plan.params})")
        return self.plan.params.index(name)

    def params_block(self) -> TensorSpec:
        """The run-time parameter block: PARAMS_MAX int32 scalars in a uniform buffer the host writes before each
        submission (kernels include glsl/params.glslh)."""
        spec = self.plan.tensors.get(PARAMS_TENSOR)
        if spec is None:
            spec = TensorSpec(PARAMS_TENSOR, (PARAMS_MAX,), PARAMS, "buffer", 0, dtype="int32")
            self.plan.tensors[PARAMS_TENSOR] = spec
        return spec

    # -- dispatches -------------------------------------------------------------------------
    def dispatch(self, stem, args, push=b"", spec=(), global_size=(1, 1, 1), family="elementwise",
                 flops=0, nbytes=0, exact_kernel=False, io=None, shared_xy=(), local_size=None, axes=None, info=None):
        """Adds a dispatch of glsl/<stem>.comp's variant with these axes (minirt.kernels.variant), at fp16 its dtype=half
        one unless exact_kernel (a kernel with no dtype axis). `io` declares the kernel's float32-edge variant (variant
        axis io, glsl/common.glslh): "in32" reads its first read argument as float32, "out32" writes its first written
        argument as float32. At fp16 it runs where that argument is a graph input or output; elsewhere a cast stands
        between (_edges). spec: minirt.kernels.spec's tuple. shared_xy: the kernel's shared memory per local x and y
        (bytes), for the picker; local_size: chosen by the family's module (minirt/kernels/) instead of by the planner.
        info: what a later plan pass reads about the work (Dispatch.info)."""
        axes = dict(axes or {})
        if self.half and not exact_kernel:
            args, io = self._edges(stem, list(args), io)
            axes["dtype"] = "half"
            if io:
                axes["io"] = io
            nbytes //= 2
        node = self.node
        d = Dispatch(kernel=variant(stem, **axes), node=node.name if node else "", op=node.op if node else "",
                     args=list(args), push=push.bytes() if isinstance(push, Push) else push,
                     spec=tuple(int(s) for s in spec), global_size=tuple(int(g) for g in global_size),
                     family=family, flops=int(flops), bytes=int(nbytes), shared_xy=tuple(shared_xy),
                     local_size=tuple(local_size) if local_size else None, stem=stem, axes=axes, info=dict(info or {}))
        self.plan.dispatches.append(d)
        return d

    def note(self, text: str) -> None:
        self.plan.notes.setdefault(self.node.name, []).append(text)

    # -- fp16 graph edges ---------------------------------------------------------------------
    def _edges(self, kernel, args, io):
        """(args, io variant or None) of a dispatch at fp16. A float32 graph input it reads stays where a sampler
        reads it (texture storage: the image view converts float32 texels as it does float16 ones) or where the
        declared in32 variant does; a float32 graph output it writes, where the out32 variant does. Anywhere else the
        kernel gets the tensor's float16 stand-in."""
        chosen = None
        for i, (name, access) in enumerate(args):
            t, root = self.plan.tensors[name], self.plan.tensors[self.plan.root(name)]
            if t.dtype != "float32" or root.role not in (INPUT, OUTPUT):
                continue      # float16 activations, and scratch that a kernel keeps in float32
            first = i == next(j for j, (_, a) in enumerate(args) if a == access)
            if (root.role, access) == (INPUT, "r"):
                if root.storage == "texture":
                    continue
                if first and io == "in32":
                    chosen = io
                else:
                    args[i] = (self._half_input(name), "r")
            elif (root.role, access) == (OUTPUT, "w"):
                if first and io == "out32" and name not in self.half_outputs:
                    chosen = io
                    self.direct_outputs.add(name)
                else:
                    args[i] = (self._half_output(name), "w")
            else:     # no op lowers to this: a bug, not a model minirt cannot run
                raise RuntimeError(f"{kernel} ({self.node}) would {'write' if access == 'w' else 'read'} float32 "
                                   f"graph {root.role} '{name}'")
        return args, chosen

    def _half_input(self, name: str) -> str:
        """The float16 copy of a float32 graph input (or of a view of one), cast at its first use."""
        if name not in self.half_inputs:
            x = self.plan.tensors[name]
            half = self.temp(f"{name}@f16", x.shape, storage=x.storage)
            if x.view_of:
                self.view(half, self.plan.tensors[self._half_input(x.view_of)], x.view_offset)
            else:
                _cast(self, x, half, "down")
            self.half_inputs[name] = half.name
        return self.half_inputs[name]

    def _half_output(self, name: str) -> str:
        """The float16 tensor written in place of graph output `name`; the final cast converts it into the output."""
        if name in self.direct_outputs:     # no op lowers to this: a bug, not a model minirt cannot run
            raise RuntimeError(f"graph output '{name}' is written as float32 and then through a float16 stand-in "
                               f"({self.node})")
        if name not in self.half_outputs:
            out = self.plan.tensors[name]
            self.half_outputs[name] = self.temp(f"{name}@f16", out.shape, storage=out.storage).name
        return self.half_outputs[name]


def lower(graph, storage, profile, options=None, precision="fp32", packs=None) -> Plan:
    return _lower(graph, storage, profile, options, precision, packs=packs).plan


def lower_mixed(graph, profile, options=None, precision="fp32", packs=None) -> Plan:
    """storage="auto" on a texture device (storage_layout.py): textures, and buffers for the nodes around a tensor
    whose image the device cannot make, or that have no texture kernel for what they are given. A node whose
    lowering makes such an image (a temporary, or a copy of a graph tensor) is moved to buffers and the graph lowered
    again, until every image fits."""
    moved = storage_layout.buffer_nodes(graph, profile)
    for _ in range(len(graph.nodes) + 1):
        ctx = _lower(graph, "texture", profile, options, precision, moved, packs)
        more = {}
        for t in ctx.plan.tensors.values():
            why = t.storage == "texture" and not t.view_of and storage_layout.too_large(t.texel_extents, profile)
            if why and ctx.made_by.get(t.name) not in moved:
                node = ctx.made_by.get(t.name)
                if node is None:     # made outside any node: nothing to move
                    break
                more[node] = f"its tensor '{t.name}' {list(t.shape)} {why}"
        if not more:
            break
        moved = {**moved, **more}
    plan = ctx.plan
    for node, why in ctx.node_storage.items():
        plan.notes.setdefault(node, []).append(f"storage: buffer ({why})")
    return plan


def _lower(graph, storage, profile, options=None, precision="fp32", node_storage=None, packs=None) -> LowerCtx:
    """The lowering of every node. node_storage (mixed storage): node name -> why it runs in buffers; any other node
    runs in `storage` ("texture"), or in buffers where its texture lowering refuses what it is given."""
    mixed = node_storage is not None
    ctx = LowerCtx(graph, storage, profile, options, precision, node_storage, packs)
    for name in graph.inputs:
        ctx.storage = _input_storage(ctx, name) if mixed else storage
        ctx.t(name)
    for node in graph.nodes:
        ctx.node = node
        ctx.storage = "buffer" if node.name in ctx.node_storage else storage
        op = ops.get(node.op, node.domain)
        if not mixed or ctx.storage == "buffer":
            op.lower(node, ctx)
            continue
        mark = _mark(ctx)
        try:
            op.lower(node, ctx)
        except UnsupportedError as e:
            _undo(ctx, mark)
            ctx.storage = "buffer"
            ctx.node_storage[node.name] = f"in textures: {e}"
            op.lower(node, ctx)
    ctx.node = None
    for name, half in ctx.half_outputs.items():
        _cast(ctx, ctx.plan.tensors[half], ctx.plan.tensors[name], "up")
    _check_outputs(ctx)
    return ctx


def _input_storage(ctx, name) -> str:
    """Mixed storage: a graph input is a texture where its image fits and some node reading it runs in textures."""
    t = ctx.graph.tensor(name)
    if t.dtype == "int32" or not t.is_static or len(t.shape) > 4:
        return "buffer"
    readers = ctx.consumers.get(name, ())
    if storage_layout.too_large(storage_layout.texture_extents(t.shape), ctx.profile) or \
            (readers and all(n.name in ctx.node_storage for n in readers)):
        return "buffer"
    return "texture"


def _mark(ctx):
    """What a node's lowering may add, as it stands before it (for _undo)."""
    return (len(ctx.plan.dispatches), len(ctx.plan.tensors), list(ctx.plan.notes.get(ctx.node.name, ())),
            dict(ctx.copies), dict(ctx.half_inputs), dict(ctx.half_outputs), set(ctx.direct_outputs))


def _undo(ctx, mark):
    """Drop what the current node's lowering added since `mark`, so that it can be lowered again in buffers."""
    n_disp, n_tensors, notes, copies, half_in, half_out, direct = mark
    del ctx.plan.dispatches[n_disp:]
    for name in list(ctx.plan.tensors)[n_tensors:]:
        del ctx.plan.tensors[name]
        ctx.made_by.pop(name, None)
    if notes:
        ctx.plan.notes[ctx.node.name] = notes
    else:
        ctx.plan.notes.pop(ctx.node.name, None)
    ctx.copies, ctx.half_inputs, ctx.half_outputs, ctx.direct_outputs = copies, half_in, half_out, direct


def _cast(ctx, src, dst, direction):
    """dst = src converted float32 -> float16 ("down") or back ("up"); same shape, storage and layout. Casts
    belong to the graph's edges, not to the node whose lowering needed one."""
    node, ctx.node = ctx.node, None
    p = Push().sizes(dst).ivec4(dst.packed_dim)
    ctx.dispatch("cast", [(dst.name, "w"), (src.name, "r")], p, (), dst.texel_extents,
                 "elementwise", nbytes=6 * dst.numel, exact_kernel=True, axes={"storage": dst.storage, "dir": direction})
    ctx.node = node
    return dst


def _copy_storage(ctx, src, dst):
    """dst = src, one a buffer and the other a texture (mixed storage); same shape and element type. A copy belongs to
    the graph's edges, as a cast does, though made at its first reader's lowering."""
    node, ctx.node = ctx.node, None
    tex = dst if dst.storage == "texture" else src
    p = Push().sizes(tex).ivec4(tex.packed_dim)
    ctx.dispatch("storage_copy", [(dst.name, "w"), (src.name, "r")], p, (), tex.texel_extents, "elementwise",
                 nbytes=2 * dst.numel * dst.itemsize, axes={"dir": "b2t" if tex is dst else "t2b"})
    ctx.node = node
    return dst


def _check_outputs(ctx: LowerCtx) -> None:
    for name in ctx.plan.outputs:
        name = ctx.half_outputs.get(name, name)    # fp16: the value may be the stand-in the final cast reads
        if ctx.plan.tensors[ctx.plan.root(name)].role in (INPUT, CONSTANT):
            raise UnsupportedError(f"{ctx.graph.source}: graph output '{name}' is a graph input or a constant; "
                                   f"minirt needs every output to be computed by a node")
