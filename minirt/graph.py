"""The op graph: plain data, no behaviour beyond bookkeeping.

Shapes are tuples whose entries are ints or strings (symbolic dims such as "batch");
None means "not inferred yet". Constants carry their numpy data.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from .errors import ModelError

MAX_LOAD_BYTES = 1 << 30
"""The most bytes of constants loading may make beyond what the model's files hold: the sum over every
constant that load-time folding makes (ConstantOfShape, Range, Expand, arithmetic on constants, ...),
each checked from its inferred shape before it is allocated. Loaders read only what their files hold
(every size is checked against the file before reading; half precision widens to float32), so their
weights do not count. A model that needs more is refused with a ModelError naming the node; override
with minirt.loaders.load(..., max_load_bytes=N) (Graph.max_load_bytes)."""


@dataclass
class Tensor:
    name: str
    shape: tuple | None = None
    dtype: str | None = None          # numpy dtype name: "float32", "int64", ...
    data: np.ndarray | None = None    # set for constants
    planner_const: bool = False       # not a constant yet, but one once the planner folds it (a quantized weight's
    #                                   DequantizeLinear: fold_dequantize_linear)

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)


@dataclass
class Node:
    op: str
    name: str
    inputs: list[str]                 # "" marks an omitted optional input
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    domain: str = ""

    def __str__(self):
        return f"{self.op} node '{self.name}'"


@dataclass
class Graph:
    tensors: dict[str, Tensor] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    name: str = ""
    source: str = "<memory>"          # where it was loaded from, for error messages
    opset: int = 0
    notes: dict = field(default_factory=dict)   # node name -> planner notes (why a rewrite fired or not)
    # Tensors that live across runs: state name -> the name of its value after this graph's run (the state's own
    # name where the graph only reads it). The state tensor itself is declared (shape, dtype) and read by name; its
    # new value is a tensor that the planner places in the state's memory, so the node making it writes the state
    # (whole, or in place: an op such as CacheWrite writes only some rows of its input, which is that state).
    state: dict = field(default_factory=dict)
    params: list = field(default_factory=list)  # names of the run-time int32 parameters nodes read (Plan.params)
    host: object = None                         # minirt.host.HostPart: what prepare(host=True) left to the host
    max_load_bytes: int | None = None           # None: MAX_LOAD_BYTES
    made_bytes: int = 0                         # bytes of constants made at load so far (charge())
    _fresh: dict = field(default_factory=dict, repr=False, compare=False)   # base -> last fresh_name suffix

    @property
    def load_limit(self) -> int:
        return MAX_LOAD_BYTES if self.max_load_bytes is None else int(self.max_load_bytes)

    def charge(self, nbytes: int, what: str) -> None:
        """Count `nbytes` about to be made at load against the limit; raise before they are allocated."""
        nbytes = int(nbytes)
        if self.made_bytes + nbytes > self.load_limit:
            before = f" (with {self.made_bytes} bytes made before it)" if self.made_bytes else ""
            raise ModelError(f"{self.source}: {what} would make {nbytes} bytes of constants at load time{before}, "
                             f"more than the limit of {self.load_limit} bytes on what loading may allocate "
                             f"(max_load_bytes); refused before allocating them")
        self.made_bytes += nbytes

    def note(self, node_name: str, text: str) -> None:
        self.notes.setdefault(node_name, []).append(text)

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelError(f"{self.source}: tensor '{name}' is used but never defined") from None

    def add_tensor(self, t: Tensor) -> Tensor:
        self.tensors[t.name] = t
        return t

    def const(self, name: str, data) -> Tensor:
        data = np.asarray(data)
        return self.add_tensor(Tensor(name, tuple(int(d) for d in data.shape), data.dtype.name, data))

    def fresh_name(self, base: str) -> str:
        # resumes from the last suffix given for this base: many names from one base stay linear
        i = self._fresh.get(base, 0)
        name = base if i == 0 else f"{base}_{i}"
        while name in self.tensors:
            i += 1
            name = f"{base}_{i}"
        self._fresh[base] = i
        return name

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def toposort(self) -> None:
        """Order nodes so each comes after the producers of its inputs; refuse cycles."""
        prod = self.producers()
        state: dict[int, int] = {}   # 1 visiting, 2 done
        order: list[Node] = []
        for root in self.nodes:
            stack = [(root, iter(root.inputs))]
            if state.get(id(root)) == 2:
                continue
            state[id(root)] = 1
            while stack:
                node, it = stack[-1]
                nxt = None
                for name in it:
                    p = prod.get(name)
                    if p is None or state.get(id(p)) == 2:
                        continue
                    if state.get(id(p)) == 1:
                        raise ModelError(f"{self.source}: the graph has a cycle through {p} "
                                         f"(tensor '{name}')")
                    nxt = p
                    break
                if nxt is None:
                    state[id(node)] = 2
                    order.append(node)
                    stack.pop()
                else:
                    state[id(nxt)] = 1
                    stack.append((nxt, iter(nxt.inputs)))
        self.nodes = order

    def copy(self) -> "Graph":
        # constants are never mutated in place, so sharing their arrays is safe
        g = copy.copy(self)
        g.tensors = {k: Tensor(t.name, t.shape, t.dtype, t.data, t.planner_const) for k, t in self.tensors.items()}
        g.nodes = [Node(n.op, n.name, list(n.inputs), list(n.outputs), dict(n.attrs), n.domain)
                   for n in self.nodes]
        g.inputs, g.outputs = list(self.inputs), list(self.outputs)
        g.notes = {k: list(v) for k, v in self.notes.items()}
        g.state, g.params = dict(self.state), list(self.params)
        g._fresh = dict(self._fresh)
        return g

    def remove_unused(self) -> None:
        """Drop nodes whose outputs nobody needs, then tensors nothing refers to."""
        needed = set(self.outputs) | set(self.state.values())
        keep = []
        for n in reversed(self.nodes):
            if any(o in needed for o in n.outputs):
                keep.append(n)
                needed.update(i for i in n.inputs if i)
        self.nodes = keep[::-1]
        used = needed | set(self.inputs) | set(self.state) | {o for n in self.nodes for o in n.outputs}
        self.tensors = {k: v for k, v in self.tensors.items() if k in used}
