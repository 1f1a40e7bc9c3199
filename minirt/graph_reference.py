"""Evaluate a Graph with the ops' numpy references (float64 by default): an oracle that needs no GPU
and no onnxruntime, used by tools and tests."""
from __future__ import annotations

import numpy as np

from . import ops
from .infer import bind_inputs, prepare


def run_graph(graph, feeds: dict, dtype=np.float64) -> dict:
    g = prepare(bind_inputs(graph, {k: v.shape for k, v in feeds.items()}))
    env = {k: np.asarray(v, dtype) for k, v in feeds.items()}
    for name, t in g.tensors.items():
        if t.is_const:
            env[name] = t.data.astype(dtype) if np.issubdtype(t.data.dtype, np.floating) else t.data
    for node in g.nodes:
        outs = ops.get(node.op, node.domain).reference(node, *[env.get(i) if i else None for i in node.inputs])
        for name, v in zip(node.outputs, outs):
            if name:
                env[name] = v
    return {name: env[name] for name in g.outputs}
