"""Op registry. Each op is one class in one module of this package: shape inference,
a numpy reference (used for constant folding and by tests), and a lowering to dispatches.
Adding an op means adding one class here and, for GPU ops, one GLSL kernel."""
from __future__ import annotations

import importlib
import pkgutil

import numpy as np

from ..errors import UnsupportedError

OPS: dict[str, "Op"] = {}


class Op:
    """Base class. Subclasses set `name` and implement what they support."""

    name = ""
    domain = ""
    gpu = True            # False: shape arithmetic that must fold away at load
    limits = ""           # known limits, for docs/ops.md

    def infer(self, node, ins):
        """[(shape, dtype)] for each output, from the input Tensors."""
        raise NotImplementedError

    def reference(self, node, *xs):
        """numpy reference: list of outputs."""
        raise NotImplementedError

    def fold(self, node, ins):
        """Outputs as numpy arrays when they are known at load time, else None.
        Default: evaluate the reference when every input is a constant."""
        if all(t is None or t.is_const for t in ins):
            return self.reference(node, *[None if t is None else t.data for t in ins])
        return None

    def check(self, node, ins):
        """A reason string when this node's configuration cannot run, else None."""
        return None

    def lower(self, node, ctx):
        raise NotImplementedError


def register(cls):
    OPS[cls.name] = cls()
    return cls


def get(op: str, domain: str = "") -> "Op | None":
    o = OPS.get(op)
    if o is None:
        return None
    if o.domain == "minirt":      # minirt's internal ops (Linear, Attention) never stand for ONNX ones
        return o if domain == "minirt" else None
    return o if domain in ("", "ai.onnx") or domain == o.domain else None


def require_supported(graph) -> None:
    """Report every unsupported op of a graph at once (op type, domain, node name)."""
    bad = [n for n in graph.nodes if get(n.op, n.domain) is None]
    if bad:
        lines = [f"  {n.op} (domain '{n.domain or 'ai.onnx'}') in node '{n.name}'" for n in bad]
        kinds = sorted({n.op for n in bad})
        raise UnsupportedError(
            f"{graph.source}: {len(bad)} node(s) use ops minirt does not support "
            f"({', '.join(kinds)}):\n" + "\n".join(lines), bad)


def attr(node, key, default=None):
    return node.attrs.get(key, default)


def np_dtype(name):
    return np.dtype(name)


for _m in pkgutil.iter_modules(__path__):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
