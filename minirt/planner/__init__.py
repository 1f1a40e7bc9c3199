"""The planner: graph-to-graph passes in a fixed order, then lowering to a Plan.

Pass order (each pass is one module of this package):
  1. fold_dequantize_linear (fold_dequantize_linear.py)  a DequantizeLinear of an int8 weight into a MatMul or Gemm
                                            -> a Linear reading the int8 (or 4-bit, blocked) weight; into a Conv: its
                                            GEMM routes read it as int8; others fold to float
  2. fold_dynamic_quantize (fold_dynamic_quantize.py)  quantize_dynamic's DynamicQuantizeLinear + MatMulInteger
                                            + Cast -> DynamicQuantize + a Linear reading the int8 weight
  3. fold_batch_norm  (fold_batch_norm.py)  an inference BatchNormalization after a Conv -> the conv's W and B
  4. fold_pad_conv    (fold_pad_conv.py)    a zero Pad of the spatial axes read by a Conv alone -> the conv's pads
  5. conv1d_as_conv2d (conv1d_as_conv2d.py) eligible 1-D convs become 2-D convs over a height of 1
  6. conv routing     (conv_routing.py)     every Conv gets one kernel: im2col, pointwise, depthwise, direct
  7. fuse_gelu        (fuse_gelu.py)        the Erf GELU pattern, and its tanh form (GPT-2), become one Gelu node
  8. fuse_layer_norm  (fuse_layer_norm.py)  LayerNorm spelt out as ReduceMean chains -> one LayerNormalization, or
                                            one AxisLayerNorm over a non-last axis (ConvNeXt's channels); a GroupNorm
                                            of one channel a group -> one InstanceNormalization with its affine
  9. fuse_silu        (fuse_silu.py)        Mul(x, Sigmoid(x)) becomes one Silu node
 10. fuse_activation  (fuse_activation.py)  Relu/Gelu/HardSwish/Silu after a conv goes into the conv's epilogue
 11. conv_output_nlc  (conv_output_nlc.py)  an im2col conv + channels-last Transpose (+ Add) -> one GEMM writing
                                            [1, L, C] (adding the residual)
 12. conv_input_nlc   (conv_input_nlc.py)   a 1-D im2col conv reading another's output: that one writes it
                                            channels-last, this one's GEMM reads it as overlapping rows (no im2col)
 13. conv_channels_last (conv_channels_last.py)  2-D convs on the buffer GEMM keep activations NHWC between them
                                            (1x1 convs as Linears over pixels), Transposes at the boundaries
 14. fuse_linear      (fuse_linear.py)      MatMul (or Gemm) + bias + scale + activation + residual -> one Linear
 15. quantize_weights (quantize_weights.py) option quantize_weights=int8: float Linear weights -> int8 a column
 16. merge_siblings   (merge_siblings.py)   Linears reading the same input (q, k, v) -> one GEMM + part views
 17. fuse_attention   (fuse_attention.py)   head splits + MatMul (+ mask) + Softmax + MatMul -> one Attention
 18. split_wide_tables (split_wide_tables.py) a Linear weight or run-time Gather table beyond
                                            maxStorageBufferRange -> parts by columns that fit, joined by a Concat
 19. lowering         (lower.py)            graph nodes -> dispatches, storage and layout per tensor (storage "auto"
                                            on a texture device: buffers where textures do not fit,
                                            storage_layout.py)
 20. fuse_reduce_layer_norm (fuse_reduce_layer_norm.py)  on the Plan: a split GEMM's reduce pass also does the
                                            LayerNorm that reads its output
 21. fuse_norm_linear_rows (fuse_norm_linear_rows.py)  on the Plan: a LayerNorm read only by a few-row Linear
                                            (linear_rows) is done by that Linear as it reads its rows
 22. local sizes      (minirt.kernels.rules) one deterministic local size per dispatch, by its family's rule
 23. memory plan      (memory_plan.py)      lifetimes for memory reuse (option memory_reuse=False: none), and
                                            the check that the device can hold what the plan allocates
The planner never imports vulkan: everything it decides is plain data in the Plan. PASSES lists the passes in this
order; each graph pass is fn(graph, options, profile): the Session's Options (storage resolved for the device) and the
DeviceProfile. A pass that an option may switch off declares the option's name (OPTION); the runner (Pass) decides
whether it runs and notes it when it does not."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from ..errors import MinirtError, UnsupportedError
from ..options import PRECISIONS, Options
from ..kernels.local_size import check_local_size, forced_local_size
from ..kernels.rules import pick_local_size
from . import (conv1d_as_conv2d, conv_channels_last, conv_input_nlc, conv_output_nlc, conv_routing, fold_batch_norm,
               fold_dequantize_linear, fold_dynamic_quantize, fold_pad_conv, fuse_activation, fuse_attention,
               fuse_gelu, fuse_layer_norm, fuse_linear, fuse_norm_linear_rows, fuse_reduce_layer_norm, fuse_silu,
               memory_plan, merge_siblings, quantize_weights, split_wide_tables)
from .lower import lower, lower_mixed
from ..plan import INPUT, OUTPUT, Plan
from .storage_layout import check_limits, resolve_storage

SWITCHED_OFF = "(planner)"     # the notes key of the passes an option switched off


@dataclass(frozen=True)
class Pass:
    """One planner pass: `function` of its module, over the graph (fn(graph, options, profile) -> graph) or, with
    on_plan, over the lowered Plan (fn(plan, profile, options) -> Plan). A module that declares OPTION names the
    Options switch that turns the pass off: the pass is run here only while it is on, and a note says when it is
    not."""
    module: ModuleType
    function: str = "rewrite"
    on_plan: bool = False

    @property
    def name(self) -> str:
        return self.module.__name__.rpartition(".")[2]

    @property
    def option(self) -> str | None:
        return getattr(self.module, "OPTION", None)

    def __call__(self, target, options, profile=None):
        """Run the pass on `target` (a Graph, or a Plan with on_plan) unless its option switches it off."""
        if self.option is not None and not getattr(options, self.option):
            target.notes.setdefault(SWITCHED_OFF, []).append(f"pass {self.name} switched off (option {self.option})")
            return target
        fn = getattr(self.module, self.function)
        return fn(target, profile, options) if self.on_plan else fn(target, options, profile)


# Every pass, in the order they run (the module docstring says what each does); lowering comes between the graph
# passes and the plan passes.
PASSES = (Pass(fold_dequantize_linear), Pass(fold_dynamic_quantize), Pass(fold_batch_norm), Pass(fold_pad_conv),
          Pass(conv1d_as_conv2d), Pass(conv_routing, "annotate"),
          Pass(fuse_gelu), Pass(fuse_layer_norm), Pass(fuse_silu), Pass(fuse_activation), Pass(conv_output_nlc),
          Pass(conv_input_nlc), Pass(conv_channels_last), Pass(fuse_linear), Pass(quantize_weights),
          Pass(merge_siblings),
          Pass(fuse_attention), Pass(split_wide_tables),
          Pass(fuse_reduce_layer_norm, on_plan=True),
          Pass(fuse_norm_linear_rows, on_plan=True))
# (name, pass) of the graph passes: a pass called as fn(graph, options, profile) -> graph
GRAPH_PASSES = [(p.name, p) for p in PASSES if not p.on_plan]


def resolve_precision(precision, profile) -> str:
    """The precision a plan runs at: fp16 needs 16-bit storage buffers (weights are buffers in both storages)."""
    if precision not in PRECISIONS:
        raise MinirtError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp16" and not profile.storage16:
        raise UnsupportedError(f"precision fp16 needs 16-bit storage buffers (storageBuffer16BitAccess), which "
                               f"'{profile.name}' does not offer; use precision fp32")
    return precision


def make_plan(graph, profile, storage=None, options=None, packs=None) -> Plan:
    """The Plan of `graph` on `profile`. options: Options or a dict of them (Options.make); storage, where given,
    overrides options.storage. packs: a lower.Packs shared by the plans of one call (a program's entry points), so
    each packs a weight the others pack as the same array, made once."""
    options = Options.of(options)
    precision = resolve_precision(options.precision, profile)
    asked = storage or options.storage
    options = options.replace(storage=resolve_storage(asked, profile))
    g = graph.copy()
    for p in PASSES:
        if not p.on_plan:
            g = p(g, options, profile)
    if asked == "auto" and options.storage == "texture":    # textures where they fit, buffers around the rest
        plan = lower_mixed(g, profile, options, precision, packs)
    else:
        plan = lower(g, options.storage, profile, options, precision, packs)
    for p in PASSES:
        if p.on_plan:
            plan = p(plan, options, profile)
    check_limits(plan, profile)
    forced = options.local_size
    if forced:
        try:
            check_local_size(forced, profile)
        except ValueError as e:
            raise MinirtError(f"forced local size {forced!r} is refused: {e}") from None
    for d in plan.dispatches:
        f = forced_local_size(d.family, options)
        if f is not None or d.local_size is None:    # (a lowering may have chosen it, by the same module's rules)
            d.local_size = pick_local_size(d.family, d.global_size, profile, f, d.shared_xy)
        groups = [-(-g // l) for g, l in zip(d.global_size, d.local_size)]
        for axis, (n, lim) in enumerate(zip(groups, profile.max_group_count)):
            if n > lim:
                raise UnsupportedError(f"{d.op} node '{d.node}' ({d.kernel}) needs {n} work groups on axis {axis}, "
                                       f"beyond the device limit {lim}")
    for t in plan.tensors.values():
        if t.storage == "buffer" and t.nbytes > profile.max_storage_buffer_range:
            raise UnsupportedError(f"tensor '{t.name}' {list(t.shape)} is {t.nbytes / 2**20:.0f} MiB, beyond the "
                                   f"device's maxStorageBufferRange ({profile.max_storage_buffer_range / 2**20:.0f} MiB)")
    plan.lifetimes = memory_plan.lifetimes(plan)
    if not options.memory_reuse:   # every tensor its own bytes (to rule out aliasing, or measure it)
        plan.lifetimes = {k: (-1, len(plan.dispatches)) for k in plan.lifetimes}
    plan.poison = options.poison
    _run_settings(plan, options, profile)
    memory_plan.check_memory(plan, profile)
    return plan


def _run_settings(plan, options, profile) -> None:
    """How the run moves data. Direct I/O (buffers only): graph inputs and/or outputs in host memory that the kernels
    read and write over the bus instead of staging copies. Zero-copy outputs: buffers only (the executor also needs
    the driver's host-memory import). The fence spin: the device table's, unless the options say."""
    roles = {"in": (INPUT,), "out": (OUTPUT,), "both": (INPUT, OUTPUT)}.get(options.direct_io, ())
    plan.direct_io = roles if plan.storage == "buffer" else ()
    plan.zero_copy = options.zero_copy and plan.storage == "buffer" and OUTPUT not in plan.direct_io
    plan.spin_ms = profile.tuning.spin_ms if options.spin_ms is None else options.spin_ms
