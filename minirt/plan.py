"""The Plan: what the executor runs, as plain data. `minirt plan` prints it; tests assert on it."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# Roles of tensors in a plan.
INPUT, OUTPUT, INTERMEDIATE, CONSTANT, WEIGHT, SCRATCH, HOST_IN, HOST_OUT = (
    "input", "output", "intermediate", "constant", "weight", "scratch", "host_in", "host_out")
# STATE: a tensor that lives across runs (Plan.state): allocated once, zero-filled, never aliased, never read back;
# the Plans of one Program share it by name. PARAMS: the run-time parameter block (Plan.params).
STATE, PARAMS = "state", "params"
PARAMS_TENSOR = "params"     # the name of the parameter block in Plan.tensors and Dispatch.args
PARAMS_MAX = 64              # int32 scalars a parameter block holds (a 256-byte uniform buffer)


FP16_MAX = 65504.0


def as_dtype(data: np.ndarray, dtype: str) -> np.ndarray:
    """data in a GPU element type ("float32" or "float16"); float16 saturates at its range instead of overflowing
    to inf (NaN and inf stay), as the kernels' stores do."""
    if dtype == "uint4":       # 4-bit weights packed by their op (ops/int8_weight.py), uploaded as they are
        return data
    if data.dtype == np.dtype(dtype):
        return data
    if dtype == "float16":
        return np.clip(data, -FP16_MAX, FP16_MAX).astype(np.float16)
    return data.astype(dtype)


def whcn(shape) -> tuple[int, int, int, int]:
    """Sizes in WHCN order (W = last dim), padded with 1s: the order kernels index in."""
    s = [1, 1, 1, 1]
    for i, d in enumerate(reversed(tuple(shape))):
        s[i] = int(d)
    return tuple(s)


def texel_extents(shape, packed_dim: int) -> tuple[int, int, int]:
    """The image extents (x, y, z) of a texture of `shape` packed along WHCN dim `packed_dim`."""
    w, h, c, n = whcn(shape)
    if packed_dim == 0:
        return ((w + 3) // 4, h, c * n)
    if packed_dim == 2:
        return (w, h, ((c + 3) // 4) * n)
    raise ValueError(f"unsupported packed dim {packed_dim}")


@dataclass
class TensorSpec:
    name: str
    shape: tuple
    role: str
    storage: str = "buffer"          # "buffer" or "texture"
    packed_dim: int = 0              # WHCN dim whose 4 neighbours share a texel (0=W, 2=C)
    data: np.ndarray | None = None   # constants (float32: converted to dtype on upload) and prepacked weights
    view_of: str | None = None       # shares the memory of another tensor (a free reshape)
    view_offset: int = 0             # a view's first element within view_of's memory (buffers only; elements
                                     # of dtype, e.g. one part of a merged GEMM's part-major output)
    dtype: str = "float32"           # element type in GPU memory: "float32", "float16", "int32" (integer
                                     # graph inputs, the parameter block), "int8" or "uint4" (quantized weights)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def whcn(self):
        return whcn(self.shape)

    @property
    def texel_extents(self) -> tuple[int, int, int]:
        """Image extents for textures; the invocation grid of per-texel kernels for both storages."""
        return texel_extents(self.shape, self.packed_dim)

    @property
    def itemsize(self) -> int:
        return {"float16": 2, "int8": 1}.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        if self.data is not None and self.role == WEIGHT:
            return int(self.data.nbytes)
        if self.storage == "texture":
            x, y, z = self.texel_extents
            return x * y * z * 4 * self.itemsize
        return self.numel * self.itemsize


@dataclass
class Dispatch:
    kernel: str                       # SPIR-V variant name in spirv/manifest.json
    node: str
    op: str
    args: list                        # [(tensor name, "r" | "w")] in binding order
    push: bytes = b""
    spec: tuple = ()                  # kernel specialization constants (ids 3, 4, ...)
    global_size: tuple = (1, 1, 1)    # invocations per axis
    family: str = "elementwise"       # for the local-size picker
    local_size: tuple | None = None   # the family's rule (minirt/kernels/rules.py), unless its module set it
    shared_xy: tuple = ()             # the kernel's shared memory, bytes per local x and per local y (the picker's
                                      # residency); () where not declared
    flops: int = 0
    bytes: int = 0
    # For planner passes, not the executor (which runs `kernel` with args, push, spec and sizes):
    stem: str = ""                    # the kernel's source, glsl/<stem>.comp ...
    axes: dict = field(default_factory=dict)   # ... and variant axes: kernel == minirt.kernels.variant(stem, **axes)
    info: dict = field(default_factory=dict)   # what a pass reads about the work (rows, n4, splits, ...), by name

    @property
    def reads(self):
        return [t for t, a in self.args if a == "r"]

    @property
    def writes(self):
        return [t for t, a in self.args if a == "w"]


@dataclass
class Plan:
    storage: str
    tensors: dict[str, TensorSpec] = field(default_factory=dict)
    dispatches: list[Dispatch] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)     # graph input names (role INPUT)
    outputs: list[str] = field(default_factory=list)    # graph output names
    host_in: dict[str, str] = field(default_factory=dict)   # input name -> host staging tensor
    host_out: dict[str, str] = field(default_factory=dict)  # output name -> host readback tensor
    notes: dict[str, list[str]] = field(default_factory=dict)  # node name -> planner notes
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)
    poison: bool = False        # fill activations with NaN before each run (testing aid)
    precision: str = "fp32"     # "fp16": activations and weights in 16-bit storage (graph inputs and outputs fp32)
    # How a run moves data (decided by make_plan from the options and the device; the executor does what they say):
    direct_io: tuple = ()       # roles (INPUT, OUTPUT) whose graph tensors live in host memory the kernels use directly
    zero_copy: bool = False     # outputs copied by the GPU into host arrays handed to the caller (where the driver can)
    spin_ms: float = 0.0        # poll the run's fence this long before a sleeping wait
    # Across runs (buffer storage; state tensors in the plan's element type):
    state: list[str] = field(default_factory=list)     # tensors (role STATE) that persist across runs; shared by
                                                       # name with the other Plans of a Program (minirt/program.py)
    params: list[str] = field(default_factory=list)    # int32 scalars of the run-time parameter block, by slot: the
                                                       # host writes them before each submission, kernels read them
                                                       # from the uniform buffer PARAMS_TENSOR (no re-recording)

    def root(self, name: str) -> str:
        while self.tensors[name].view_of:
            name = self.tensors[name].view_of
        return name

    def byte_offset(self, name: str) -> int:
        """Where a tensor starts within its root's memory, in bytes (0 for roots and plain reshapes)."""
        off = 0
        while self.tensors[name].view_of:
            t = self.tensors[name]
            off += t.view_offset * t.itemsize
            name = t.view_of
        return off


class Push:
    """Builds push-constant bytes from 16-byte vectors, so std430 offsets never surprise."""

    def __init__(self):
        self.parts: list[bytes] = []

    def ivec4(self, *v) -> "Push":
        v = list(v) + [0] * (4 - len(v))
        self.parts.append(struct.pack("<4i", *[int(x) for x in v]))
        return self

    def vec4(self, *v) -> "Push":
        v = list(v) + [0.0] * (4 - len(v))
        self.parts.append(struct.pack("<4f", *[float(x) for x in v]))
        return self

    def sizes(self, t: TensorSpec) -> "Push":
        return self.ivec4(*t.whcn)

    def bytes(self) -> bytes:
        out = b"".join(self.parts)
        assert len(out) <= 128, "push constants must fit the 128 bytes every device guarantees"
        return out
