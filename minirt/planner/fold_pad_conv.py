"""Fold a zero Pad of the spatial axes into the Conv that reads it: TensorFlow's SAME padding, written by exporters
as an explicit Pad (more after than before for a stride-2 conv on an even size) then a Conv with no padding, becomes
one Conv with asymmetric pads, as torch.export's exporter writes it itself. The Pad must be in constant mode with
value 0, pad no batch or channel, pad nothing negative, and be read by that Conv alone; the Conv's auto_pad must be
NOTSET. Saves the padded copy and its dispatch."""
from __future__ import annotations

import numpy as np

from .. import ops

OPTION = "fold_pad_conv"     # the option that switches this pass off (minirt/planner/__init__.py runs it)


def rewrite(graph, options, profile=None):
    prod, cons = graph.producers(), graph.consumers()
    drop = set()
    pad_op = ops.get("Pad")
    for conv in graph.nodes:
        pad = prod.get(conv.inputs[0]) if conv.op == "Conv" and conv.domain in ("", "ai.onnx") else None
        if (pad is None or pad.op != "Pad" or pad.domain not in ("", "ai.onnx") or conv.inputs[0] in graph.outputs
                or len(cons.get(conv.inputs[0], [])) != 1 or conv.attrs.get("auto_pad", "NOTSET") not in
                ("NOTSET", b"NOTSET") or pad.attrs.get("mode", "constant") not in ("constant", b"constant")):
            continue
        ins = [graph.tensors.get(n) if n else None for n in pad.inputs]
        if any(t is not None and not t.is_const for t in ins[1:]) or ins[0].shape is None:
            continue
        rank = len(ins[0].shape)
        xs = [None if t is None else t.data for t in ins]
        begin, end = pad_op._pads(pad, rank, xs)
        if pad_op._value(pad, xs) != 0.0 or min(begin + end) < 0 or any(begin[:2] + end[:2]):
            continue
        spatial = rank - 2
        old = [int(p) for p in conv.attrs.get("pads", [0] * (2 * spatial))]
        conv.attrs["pads"] = [int(v) for v in np.add(old, begin[2:] + end[2:])]
        conv.inputs[0] = pad.inputs[0]
        drop.add(id(pad))
        graph.note(conv.name, f"folded Pad '{pad.name}' (begin {begin[2:]}, end {end[2:]}) into the conv's pads")
    graph.nodes = [n for n in graph.nodes if id(n) not in drop]
    graph.remove_unused()
    return graph
