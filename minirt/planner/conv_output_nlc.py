"""conv_output_nlc: an im2col conv whose output is only transposed channels-last writes channels-last itself,
and an Add of a [L, C] tensor after it (Whisper's positional embedding) becomes its GEMM's residual.

Whisper's front end is Conv (GELU fused) -> [1, C, L] -> Transpose(0, 2, 1) -> [1, L, C] -> Add(pos [L, C]).
The im2col GEMM computes rows = output positions by columns = output channels and scatters them into NCHW
(OUT_MODE 1) only to make the conv's output channels-first. Stored row-major (OUT_MODE 0) the same result is
the transposed [L, C], and that epilogue adds a residual[m, n] after bias and activation, as the graph's
act(conv + bias) -> Transpose -> Add does: the Transpose's copy and the Add's elementwise dispatch go.

Pattern (after conv1d_as_conv2d and fuse_activation): a Conv routed to im2col with output [1, C, H, W] (a 1-D
conv rewritten to 2-D over a height of 1, or any 2-D conv), then Reshape/Squeeze/Unsqueeze/Flatten nodes that
end at [1, C, H * W] (they only relabel the row-major order, so that is the GEMM's column-major result), then a
Transpose with perm (0, 2, 1); each of these tensors read by the next node only and none a graph output. Then,
when the Transpose's output is read only by an Add (and is no graph output), the Add folds in if its other
operand is [L, C] or [1, L, C] (L = H * W): the same elements after broadcasting a leading 1. Any other shape
broadcasts differently (a [C] or [1, 1, C] row, an [L, 1] column) and leaves the Add as it is.

Result: the Conv gets attrs["_out_layout"] = "NLC"; its output is the Transpose's output tensor (or the Add's),
[1, L, C]; the residual is its 4th input (the bias slot "" when there is none); Conv.infer and Conv.reference
follow these. With a residual the Conv takes the Add's place in the node order, where the residual exists.

A batch of N: [N, C, H, W] -> [N, L, C], the Add's other operand [N, L, C] (image n's rows added to image n's) or
[L, C] / [1, L, C] (the same rows added to every image's); the lowering runs the GEMM image by image.

Left alone, with a note: texture storage and the general GEMM (option fast_gemm off): neither has a
row-major output with a residual. Session option conv_output_nlc=False turns the pass off."""
from __future__ import annotations

from ..kernels.gemm import fast_gemm

OPTION = "conv_output_nlc"     # the option that switches this pass off (minirt/planner/__init__.py runs it)


RESHAPES = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")   # row-major relabelings (ops.shape_ops.ReshapeLike)


def rewrite(graph, options, profile=None):
    cons = graph.consumers()
    replace, drop = {}, set()

    def sole(name):
        c = cons.get(name, [])
        return c[0] if len(c) == 1 and name not in graph.outputs else None

    for conv in graph.nodes:
        if conv.op != "Conv" or conv.attrs.get("_route") != "im2col" or "_out_layout" in conv.attrs:
            continue
        chain = _to_transpose(conv, graph, sole)
        if chain is None:
            continue
        why = _why_not(conv, graph, options)
        if why:
            graph.note(conv.name, f"conv output stays channels-first before Transpose '{chain[-1].name}': {why}")
            continue
        _rewire(conv, chain, graph)
        drop.update(id(n) for n in chain)
        add = sole(conv.outputs[0])
        if add is None or add.op != "Add":
            continue
        res = _residual(add, conv.outputs[0], graph)
        if res is None:
            graph.note(conv.name, f"Add '{add.name}' not folded: its other operand is not [L, C] or [1, L, C]")
            continue
        _fold_add(conv, add, res, graph)
        drop.add(id(conv))
        replace[id(add)] = conv
    if drop:
        graph.nodes = [replace.get(id(n), n) for n in graph.nodes if id(n) not in drop]
        graph.remove_unused()     # the reshapes' shape constants
    return graph


def _to_transpose(conv, graph, sole):
    """[reshapes.., Transpose] from the conv's [1, C, H, W] output to a channels-last [1, H * W, C], or None."""
    y = graph.tensor(conv.outputs[0])
    if not y.is_static or len(y.shape) != 4:
        return None
    n, c, h, w = y.shape
    chain, nxt = [], sole(conv.outputs[0])
    while nxt is not None and nxt.op in RESHAPES:
        chain.append(nxt)
        nxt = sole(nxt.outputs[0])
    flat = graph.tensor(chain[-1].outputs[0]).shape if chain else None
    if nxt is None or nxt.op != "Transpose" or flat != (n, c, h * w):
        return None
    if [int(p) for p in nxt.attrs.get("perm", ())] != [0, 2, 1]:
        return None
    return chain + [nxt]


def _why_not(conv, graph, options) -> str | None:
    if not fast_gemm(options.planned_storage, options):
        return (f"only the buffer GEMM writes rows with a residual ({options.planned_storage} storage"
                f"{', fast_gemm off' if not options.fast_gemm else ''})")
    return None


def _rewire(conv, chain, graph):
    """The conv writes the Transpose's output; the tensors in between go."""
    for n in [conv] + chain[:-1]:
        del graph.tensors[n.outputs[0]]     # each was read by the next node only
    conv.outputs[0] = chain[-1].outputs[0]
    conv.attrs["_out_layout"] = "NLC"
    graph.note(conv.name, f"conv writes channels-last {list(graph.tensor(conv.outputs[0]).shape)}; removed "
                          f"Transpose '{chain[-1].name}'" + "".join(f", {n.op} '{n.name}'" for n in chain[:-1]))


def _residual(add, cur, graph) -> str | None:
    """The Add's other operand when it adds elementwise to [1, L, C] as [L, C] or [1, L, C], else None."""
    a, b = add.inputs
    other = b if a == cur else a
    shape = graph.tensor(cur).shape
    if other == cur or graph.tensor(other).shape not in (shape, shape[1:], (1,) + tuple(shape[1:])):
        return None
    return other


def _fold_add(conv, add, res, graph):
    del graph.tensors[conv.outputs[0]]      # the Add was its only reader
    ins = list(conv.inputs) + [""] * (3 - len(conv.inputs))
    conv.inputs = ins[:3] + [res]
    conv.outputs[0] = add.outputs[0]
    graph.note(conv.name, f"folded Add '{add.name}' into the GEMM epilogue as the residual '{res}'")
