"""Integer and boolean tensors computed on the host, each run, from a model's integer and boolean inputs.

A text model's inputs are token ids and an attention mask (int64), and its graph builds masks, position ids and
index tensors from them (Cast, Equal, And, Where, Range, CumSum, Expand, ...). minirt's GPU kernels compute in
float32, so these run on the host instead, with the ops' numpy references (exact: the integer arithmetic is the
integer arithmetic, a Cast to float is one rounding as in onnxruntime), before the recorded command buffer is
submitted. What they hand the GPU (the boundary) is float32 (an additive mask, the embeddings of constant tables
gathered by the ids in texture storage, or from a table larger than one storage buffer of the device), or int32 row
indices of an embedding Gather that runs on the GPU (buffer storage), checked against the table's rows and made
non-negative first. The replayed GPU part stays float32.

Which nodes run here is decided by prepare() (minirt/infer.py, `host=True`; Session passes it): a node all of whose
inputs are constants or host values, reading at least one host value, runs on the host when its op runs only on
the host (the shape-arithmetic ops of minirt/ops/shape_arith.py) or when a host value it reads is not float32;
a GPU op reading only float32 host values runs on the GPU. Host values begin at the graph inputs that are not
float32, and at the float32 inputs that only host-only ops read. Their shapes are found when the plan is made, by
evaluating the nodes on inputs of ones; a run whose host values come out with other shapes (shapes that depend on
the input values) is refused."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import InputError, MinirtError, ModelError

FLOAT = "float32"


@dataclass
class Boundary:
    """A host value the GPU part reads, as a graph input of the GPU part."""
    name: str               # the GPU part's input
    source: str             # the host value
    rows: int = 0           # > 0: int32 row indices of a GPU Gather into a table of `rows` rows; else float32
    reader: str = ""        # the node that reads it (for errors)


@dataclass
class HostPart:
    """The host's share of one planned shape: plain data, evaluated by run()."""
    source: str = "<memory>"
    inputs: dict = field(default_factory=dict)       # graph input -> dtype name (read here)
    nodes: list = field(default_factory=list)        # in order
    consts: dict = field(default_factory=dict, repr=False)   # constant name -> array, those the nodes read
    shapes: dict = field(default_factory=dict)       # host value -> its planned shape
    dtypes: dict = field(default_factory=dict)       # host value -> its dtype name
    boundary: list = field(default_factory=list)     # [Boundary]
    outputs: list = field(default_factory=list)      # graph outputs computed here
    same: dict = field(default_factory=dict)         # host value -> the earlier one it equals (a node repeated)

    def run(self, feeds: dict) -> tuple[dict, dict]:
        """(the GPU part's inputs from the boundary, the graph outputs computed here) for one run's feeds."""
        from . import ops
        env = dict(self.consts)
        env.update({k: feeds[k] for k in self.inputs})
        for node in self.nodes:
            args = [env[i] if i else None for i in node.inputs]
            self._check_size(node, args)
            try:
                outs = ops.get(node.op, node.domain).reference(node, *args)
            except Exception as e:      # an index out of range, ...: the node and the run-time tensors it read
                read = ", ".join(f"'{i}'" for i in node.inputs if i and i not in self.consts)
                why = str(e).removeprefix(f"{node}: ") if isinstance(e, MinirtError) else f"{type(e).__name__}: {e}"
                raise InputError(f"{self.source}: {node}, run on the host, failed on this run's {read}: {why}") \
                    from None
            for name, v in zip(node.outputs, outs):
                if not name:
                    continue
                v = np.asarray(v)
                if tuple(v.shape) != tuple(self.shapes[name]):
                    raise InputError(f"{self.source}: '{name}' from {node} has shape {list(v.shape)} for this run's "
                                     f"input values, where the plan has {list(self.shapes[name])}: its shape "
                                     f"depends on the values of the inputs, which minirt does not run")
                env[name] = v
        return ({b.name: self._cross(b, env[b.source]) for b in self.boundary},
                {o: env[self.same.get(o, o)] for o in self.outputs})

    def _check_size(self, node, args):
        """Refuse, before anything is allocated, an op whose result's size comes from this run's values (a
        ConstantOfShape of a shape read from the inputs) and is not the planned one."""
        size = _SIZES.get(node.op)
        if size is None:
            return
        try:
            n = size(*args)
        except Exception:           # malformed values: the op's reference says what is wrong
            return
        want = int(np.prod(self.shapes[node.outputs[0]], dtype=np.int64))
        if n != want:
            raise InputError(f"{self.source}: {node} would make {n} elements for this run's input values, where the "
                             f"plan has {want} ({list(self.shapes[node.outputs[0]])}): its shape depends on the values "
                             f"of the inputs, which minirt does not run")

    def _cross(self, b, v):
        if not b.rows:
            return np.ascontiguousarray(v, np.float32)
        if v.size and (v.min() < -b.rows or v.max() >= b.rows):
            bad = v[(v < -b.rows) | (v >= b.rows)].reshape(-1)[0]
            raise InputError(f"{self.source}: index {int(bad)} in '{b.source}' (read by {b.reader}) is out of range "
                             f"for a table of {b.rows} rows (valid: {-b.rows} to {b.rows - 1})")
        return np.ascontiguousarray(np.where(v < 0, v + b.rows, v), np.int32)


def _ints(v):
    return [int(d) for d in np.asarray(v).reshape(-1)]


# elements of the result of ops whose result's size is read from their input values, from those values alone
_SIZES = {
    "ConstantOfShape": lambda shape: int(np.prod(_ints(shape), dtype=np.float64)),
    "Range": lambda start, limit, delta: max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0),
    "Expand": lambda x, shape: int(np.prod(np.broadcast_shapes(np.shape(x), tuple(_ints(shape))), dtype=np.float64)),
    "Tile": lambda x, reps: int(np.prod(np.multiply(np.shape(x), _ints(reps)), dtype=np.float64)),
}


class HostSplit:
    """prepare()'s bookkeeping of host values while it walks the graph."""

    def __init__(self, graph, runtime_gather: int):
        self.graph, self.runtime_gather = graph, runtime_gather
        self.part = HostPart(source=graph.source)
        self.values = {}          # host value -> the array computed from inputs of ones (its shape and dtype)
        self.crossed = {}         # (source, rows) -> boundary name
        self.seen = {}            # what a host node computes (_key) -> its outputs

    def add_input(self, name) -> bool:
        """Make a graph input a host value (one that is not float32, or that only host-only ops read); False when its
        shape is not static yet."""
        t = self.graph.tensors[name]
        if not t.is_static:
            return False
        self.part.inputs[name] = t.dtype
        self.values[name] = np.ones(t.shape, t.dtype)
        self.part.shapes[name], self.part.dtypes[name] = tuple(t.shape), t.dtype
        return True

    def reads_host(self, node) -> bool:
        return any(i in self.values for i in node.inputs if i)

    def on_host(self, op, node, ins) -> bool:
        """Whether the node runs here: every input a constant or a host value, and its op runs only on the host, or
        it reads a host value that is not float32 (other than the rows of a GPU Gather)."""
        if not all(t is None or t.is_const or t.name in self.values for t in ins):
            return False
        if self._gpu_gather(node, ins):
            return False
        return not op.gpu or any(t is not None and t.name in self.values and self.values[t.name].dtype != FLOAT
                                 for t in ins)

    def _gpu_gather(self, node, ins) -> int:
        """The rows of the table a Gather or GatherND picks from by host indices on the GPU (buffer storage, axis 0,
        a float32 table that is not a host value, of at most runtime_gather bytes), else 0."""
        if not self.runtime_gather or node.op not in ("Gather", "GatherND") or len(ins) < 2 or ins[1] is None:
            return 0
        data, idx = ins
        if data.name in self.values or data.dtype != FLOAT or ins[1].name not in self.values or not data.shape:
            return 0
        if data.is_const and data.data.nbytes > self.runtime_gather:     # a table no GPU buffer can hold
            return 0
        if node.op == "Gather" and int(node.attrs.get("axis", 0)) != 0:
            return 0
        if node.op == "GatherND" and (int(node.attrs.get("batch_dims", 0)) != 0 or not idx.shape
                                      or idx.shape[-1] != 1):
            return 0
        return int(data.shape[0])

    def _key(self, node, ins):
        """What a host node computes: its op, attributes and inputs (host values by the first of equal ones, small
        constants by value), so that a repeat (an exporter's mask made again for each layer) is computed once."""
        args = []
        for t in ins:
            if t is None or not t.is_const:
                args.append(None if t is None else t.name)
            else:
                d = t.data
                args.append((d.dtype.str, d.shape, d.tobytes()) if d.nbytes <= 4096 else t.name)
        attrs = tuple(sorted((k, (v.dtype.str, v.shape, v.tobytes()) if isinstance(v, np.ndarray) else repr(v))
                             for k, v in node.attrs.items() if k != "_opset"))
        return node.op, node.domain, attrs, tuple(args)

    def evaluate(self, op, node, ins) -> None:
        """Run the node on the probe values (inputs of ones) and make it part of the host's share, once for
        nodes that compute the same."""
        same = self.part.same
        node.inputs = [same.get(i, i) for i in node.inputs]
        ins = [self.graph.tensor(i) if i else None for i in node.inputs]
        key = self._key(node, ins)
        prev = self.seen.get(key)
        if prev is not None:
            for name, p in zip(node.outputs, prev):
                if name and p:
                    same[name] = p
                    self.values[name] = self.values[p]
                    self._declare(name, self.values[p], ins)
            return
        self.seen[key] = list(node.outputs)
        args = [None if t is None else t.data if t.is_const else self.values[t.name] for t in ins]
        try:
            outs = op.reference(node, *args)
        except MinirtError:
            raise
        except Exception as e:
            raise ModelError(f"{self.graph.source}: {node} (run on the host) failed on inputs of ones: "
                             f"{type(e).__name__}: {e}") from None
        for t in ins:
            if t is not None and t.is_const:
                self.part.consts[t.name] = t.data
        for name, v in zip(node.outputs, outs):
            if name:
                self.values[name] = np.asarray(v)
                self._declare(name, self.values[name], ins)
        self.part.nodes.append(node)

    def _declare(self, name, v, ins):
        self.part.shapes[name], self.part.dtypes[name] = tuple(v.shape), v.dtype.name
        t = self.graph.tensors.get(name) or self.graph.add_tensor(type(ins[0])(name))
        t.shape, t.dtype, t.data = tuple(int(d) for d in v.shape), v.dtype.name, None

    def connect(self, op, node, ins):
        """Rewire a GPU node's host inputs to boundary inputs of the GPU part; a reason string where one cannot cross
        (an integer or boolean tensor read as data by a GPU op)."""
        rows = self._gpu_gather(node, ins)
        for k, t in enumerate(ins):
            if t is None or t.name not in self.values:
                continue
            if t.name in self.part.same:         # read the first of equal host values
                node.inputs[k] = self.part.same[t.name]
                t = self.graph.tensor(node.inputs[k])
            v = self.values[t.name]
            if k == 1 and rows:
                key = (t.name, rows)
                if key not in self.crossed:
                    name = t.name if v.dtype == np.int32 and t.name in self.part.inputs else \
                        self.graph.fresh_name(f"{t.name}.int32")
                    self.graph.add_tensor(type(t)(name, tuple(v.shape), "int32"))
                    self.crossed[key] = name
                    self.part.boundary.append(Boundary(name, t.name, rows, str(node)))
                node.inputs[k] = self.crossed[key]
            elif v.dtype == FLOAT:
                if (t.name, 0) not in self.crossed:
                    self.crossed[(t.name, 0)] = t.name
                    self.part.boundary.append(Boundary(t.name, t.name, 0, str(node)))
            else:     # the op's own reason where it has one (a Reshape's shape computed on the host)
                return op.check(node, ins) or (f"reads '{t.name}', a {v.dtype} tensor computed on the host from the "
                                               f"model's integer or boolean inputs; on the GPU minirt's {node.op} "
                                               f"takes float32 tensors")
        return None

    def finish(self, graph) -> HostPart:
        """Set the GPU part's inputs and outputs (the boundary takes the host inputs' place) and return the host's."""
        part = self.part
        part.outputs = [o for o in graph.outputs if o in self.values]
        graph.inputs = list(dict.fromkeys([i for i in graph.inputs if i not in part.inputs]
                                          + [b.name for b in part.boundary]))
        graph.outputs = [o for o in graph.outputs if o not in self.values]
        return part
