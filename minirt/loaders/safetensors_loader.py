"""safetensors -> Graph, and safetensors weights for an ONNX graph.

load_safetensors(path): a Hugging Face Whisper checkpoint (`model.encoder.conv1.weight`, ..., or the encoder
alone with an `encoder.` prefix or none; decoder tensors of a whole WhisperForConditionalGeneration are
ignored) becomes the encoder's Graph, built node by node the way torch.onnx exports HF's WhisperEncoder:
Conv + Gelu twice, Transpose, + positions, then per layer LayerNormalization, MatMul + Add projections,
Reshape / Transpose into heads, MatMul, Softmax, MatMul, and a GELU MLP; a final LayerNormalization.
Input `input_features` [1, n_mels, 2 * max_source_positions], output `last_hidden_state`.
The config comes from a config.json beside the file when there is one (Hugging Face keys), otherwise
from the tensors: d_model and mel bins from conv1, layers from the names, heads = d_model / 64,
positions from embed_positions.

apply_weights(graph, path): replaces a loaded ONNX graph's initializers by name (Session(model.onnx,
weights=weights.safetensors)).

Half-precision tensors (F16, BF16) are widened to float32.
"""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelError, UnsupportedError
from ..graph import Graph, Node, Tensor
from ..quant import QuantizedWeight

OPSET = 20
HEAD_DIM = 64           # every Whisper size uses 64-wide heads
LN_EPS = 1e-5

# safetensors dtype -> (numpy dtype of the stored bytes, bytes per element)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_MAX_HEADER = 100 << 20


# -- reading ---------------------------------------------------------------------------------------

class SafetensorsFile:
    """The header of a safetensors file, checked against the file's size, and its tensors on demand
    (read with the `safetensors` package; BF16 by bit shifting since numpy has no bfloat16)."""

    def __init__(self, path):
        self.path = Path(path)
        self.source = str(path)
        if not self.path.is_file():
            raise ModelError(f"{self.source}: no such safetensors file")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{self.source}: not a safetensors file ({size} bytes, shorter than the "
                                 f"8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ModelError(f"{self.source}: corrupt or truncated safetensors file (header length {n} "
                                 f"bytes, file {size} bytes)")
            raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
        except (ValueError, RecursionError) as e:      # RecursionError: JSON nested thousands deep
            raise ModelError(f"{self.source}: corrupt safetensors header ({type(e).__name__}: {e})") from None
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start = 8 + n
        data_len = size - self.data_start
        self.entries: dict[str, tuple[str, tuple, int, int]] = {}
        end_max = 0
        for name, e in header.items():
            try:
                dtype, shape, (begin, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
                if not all(_is_int(v) for v in (*shape, begin, end)):
                    raise ValueError("not integers")
            except (TypeError, KeyError, ValueError):
                raise ModelError(f"{self.source}: corrupt safetensors header: entry for tensor '{name}' is "
                                 f"{_short(e)}") from None
            if not isinstance(dtype, str) or dtype not in _DTYPES:
                raise UnsupportedError(f"{self.source}: tensor '{name}' has dtype {_short(dtype)}, which minirt "
                                       f"does not read (supported: {', '.join(_DTYPES)})")
            numel = 1
            for d in shape:       # Python integers: an int64 product of huge dims could wrap to a small one
                numel *= max(d, 0)
            want = numel * np.dtype(_DTYPES[dtype]).itemsize
            if min(shape, default=0) < 0 or not 0 <= begin <= end or end - begin != want:
                raise ModelError(f"{self.source}: corrupt safetensors header: tensor '{name}' ({dtype} "
                                 f"{list(shape)}) spans bytes [{begin}, {end}), which is not {want} bytes")
            if end > data_len:
                raise ModelError(f"{self.source}: truncated: tensor '{name}' needs bytes up to {end} of the "
                                 f"data section but the file holds only {data_len} (file size {size}, "
                                 f"expected {self.data_start + max(end, end_max)} or more)")
            end_max = max(end_max, end)
            self.entries[name] = (dtype, shape, begin, end)
        if end_max != data_len:
            raise ModelError(f"{self.source}: corrupt safetensors file: the tensors cover {end_max} bytes of "
                             f"data but the file has {data_len} after the header")
        self._handle = None

    def keys(self):
        return list(self.entries)

    def shape(self, name) -> tuple:
        return self.entries[name][1]

    def dtype(self, name) -> str:
        return self.entries[name][0]

    def get(self, name, float32=True) -> np.ndarray:
        """The tensor as a numpy array; floating dtypes become float32 unless float32=False
        (F16 / BF16 always widen: the runtime computes in float32)."""
        dtype, shape, begin, end = self.entries[name]
        try:
            if dtype == "BF16":
                raw = self._raw(begin, end)
                x = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
            else:
                x = self._read(name)
                if x.shape != shape:
                    raise ModelError(f"{self.source}: tensor '{name}' read back with shape {list(x.shape)}, "
                                     f"header says {list(shape)}")
            if x.dtype == np.float16 or (float32 and x.dtype == np.float64):
                x = x.astype(np.float32)
            return np.ascontiguousarray(x)
        except (MemoryError, ValueError, OverflowError) as e:     # numpy's, on what the file holds
            raise ModelError(f"{self.source}: tensor '{name}' cannot be read ({type(e).__name__}: {e})") from None

    def _read(self, name):
        from safetensors import safe_open
        try:
            if self._handle is None:
                self._handle = safe_open(self.source, framework="numpy")
            return self._handle.get_tensor(name)
        except Exception as e:      # SafetensorError, or the file changed under us, out of memory
            raise ModelError(f"{self.source}: corrupt safetensors file reading tensor '{name}' "
                             f"({type(e).__name__}: {e})") from None

    def _raw(self, begin, end) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.data_start + begin)
                raw = f.read(end - begin)
        except (OSError, MemoryError) as e:
            raise ModelError(f"{self.source}: cannot read bytes [{begin}, {end}) of the data "
                             f"({type(e).__name__}: {e})") from None
        if len(raw) != end - begin:
            raise ModelError(f"{self.source}: truncated while reading bytes [{begin}, {end}) of the data")
        return raw


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v, n=200) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + f"... ({len(r)} characters)"


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Every tensor of a file, floats as float32."""
    f = SafetensorsFile(path)
    return {k: f.get(k) for k in f.keys()}


# -- ONNX initializers from a safetensors file -------------------------------------------------------

def apply_weights(graph: Graph, weights, *, allow_extra: bool = False) -> Graph:
    """Replace graph constants (an ONNX model's initializers) by name with the tensors of `weights`
    (a safetensors path, or a {name: array} dict).

    Every floating-point initializer must be in the file (integer ones, such as reshape targets, are
    structure and may stay in the model); a tensor of the file that names no initializer is an error
    unless allow_extra (it would otherwise be silently unused: a sign the file belongs to another model
    or a name is misspelt). Shapes must match exactly; floats are cast to the initializer's dtype.
    The graph's constants must be just its initializers, as when load_onnx calls this (Constant nodes
    become constants after it)."""
    if isinstance(weights, dict):
        source, names = "<weights dict>", list(weights)
        def get(k):
            return np.asarray(weights[k])
        def shape(k):
            return tuple(np.shape(weights[k]))
    else:
        f = SafetensorsFile(weights)
        source, names, shape = f.source, f.keys(), f.shape
        def get(k):
            return f.get(k, float32=False)
    inits = {k: t for k, t in graph.tensors.items() if t.is_const}
    extra = [k for k in names if k not in inits]
    have = set(names)
    missing = [k for k, t in inits.items() if k not in have and np.issubdtype(t.data.dtype, np.floating)]
    problems = []
    if missing:
        problems.append(f"{len(missing)} initializer(s) of {graph.source} missing from it: " + _some(missing))
    if extra and not allow_extra:
        problems.append(f"{len(extra)} tensor(s) that name no initializer of {graph.source}: " + _some(extra))
    for k in names:
        if k in inits and shape(k) != tuple(inits[k].data.shape):
            problems.append(f"tensor '{k}' has shape {list(shape(k))} but the model's initializer is "
                            f"{list(inits[k].data.shape)}")
    if problems:
        raise ModelError(f"{source}: weights do not match the model: " + "; ".join(problems))
    for k in names:
        if k not in inits:
            continue
        t, x = inits[k], get(k)
        want = t.data.dtype
        if x.dtype != want:
            if not (np.issubdtype(x.dtype, np.floating) and np.issubdtype(want, np.floating)):
                raise ModelError(f"{source}: tensor '{k}' is {x.dtype} but the model's initializer is {want}")
            x = x.astype(want)
        t.data = np.ascontiguousarray(x)
    return graph


def _some(names, n=8):
    shown = ", ".join(f"'{x}'" for x in names[:n])
    return shown + (f", ... ({len(names) - n} more)" if len(names) > n else "")


# -- Whisper encoder from a Hugging Face checkpoint -------------------------------------------------

_PREFIXES = ("model.encoder.", "encoder.", "")
_LAYER = re.compile(r"layers\.(\d+)\.")
# the config keys minirt reads, each with the largest value it accepts (Whisper large: d_model 1280,
# 32 layers, 20 heads, 128 mel bins, 1500 positions): a bigger one is refused before anything is made
_CONFIG_LIMITS = {"d_model": 1 << 15, "encoder_layers": 1 << 10, "encoder_attention_heads": 1 << 10,
                  "num_mel_bins": 1 << 12, "max_source_positions": 1 << 16}
_CONFIG_KEYS = tuple(_CONFIG_LIMITS)
_MAX_CONFIG_BYTES = 16 << 20      # a Hugging Face config.json is a few kilobytes


def whisper_config(st: SafetensorsFile, config_path=None) -> dict:
    """{prefix, d_model, encoder_layers, encoder_attention_heads, num_mel_bins, max_source_positions}:
    from config.json where it says, else from the tensors."""
    keys = set(st.keys())
    prefix = next((p for p in _PREFIXES if p + "conv1.weight" in keys), None)
    if prefix is None:
        raise ModelError(f"{st.source}: not a Whisper checkpoint in Hugging Face naming: no "
                         + " / ".join(f"'{p}conv1.weight'" for p in _PREFIXES))
    c1 = st.shape(prefix + "conv1.weight")
    if len(c1) != 3 or c1[2] != 3:
        raise ModelError(f"{st.source}: '{prefix}conv1.weight' has shape {list(c1)}, expected "
                         f"[d_model, n_mels, 3]")
    layers = _layer_indices(st, keys, prefix)
    pos = prefix + "embed_positions.weight"
    cfg = {"prefix": prefix, "d_model": c1[0], "num_mel_bins": c1[1],
           "encoder_layers": len(layers),
           "encoder_attention_heads": max(c1[0] // HEAD_DIM, 1),
           "max_source_positions": st.shape(pos)[0] if pos in keys and len(st.shape(pos)) == 2 else 1500}
    cfg["source"] = "tensor shapes"
    if config_path is not None and Path(config_path).is_file():
        _inside_model_folder(Path(config_path), st.path)
        try:
            size = Path(config_path).stat().st_size
            if size > _MAX_CONFIG_BYTES:
                raise ValueError(f"{size} bytes, more than a config.json's {_MAX_CONFIG_BYTES}")
            j = json.loads(Path(config_path).read_text())
        except (OSError, ValueError, RecursionError) as e:
            raise ModelError(f"{config_path}: not a readable config.json ({type(e).__name__}: {e})") from None
        # a config.json of something else (CTranslate2's, a tokenizer's) has none of these keys: ignore it
        if isinstance(j, dict) and (j.get("model_type") == "whisper" or any(k in j for k in _CONFIG_KEYS)):
            if j.get("model_type", "whisper") != "whisper":
                raise ModelError(f"{config_path}: model_type {_short(j['model_type'])}; minirt builds Whisper "
                                 f"encoders from safetensors")
            act = j.get("activation_function", "gelu")
            if act != "gelu":
                raise UnsupportedError(f"{config_path}: activation_function {_short(act)}; the Whisper encoder "
                                       f"minirt builds uses exact GELU ('gelu')")
            for k, limit in _CONFIG_LIMITS.items():
                if k in j:
                    v = j[k]
                    if isinstance(v, float) and v.is_integer():
                        v = int(v)
                    if not _is_int(v):
                        raise ModelError(f"{config_path}: {k} is {_short(v)}, not an integer")
                    if not 1 <= v <= limit:
                        raise ModelError(f"{config_path}: {k} is {v}; minirt takes 1 to {limit}")
                    cfg[k] = v
            cfg["source"] = str(config_path)
    d, h = cfg["d_model"], cfg["encoder_attention_heads"]
    if d != c1[0] or cfg["num_mel_bins"] != c1[1]:
        raise ModelError(f"{st.source}: '{prefix}conv1.weight' is {list(c1)} but {cfg['source']} says "
                         f"d_model {d}, num_mel_bins {cfg['num_mel_bins']}")
    if h < 1 or d % h:
        raise ModelError(f"{st.source}: d_model {d} is not divisible by {h} attention heads")
    found = len(layers)
    if cfg["encoder_layers"] != found:
        raise ModelError(f"{st.source}: {cfg['source']} says encoder_layers {cfg['encoder_layers']} but the "
                         f"checkpoint has {found} ('{prefix}layers.N.*')")
    if cfg["encoder_layers"] < 1:
        raise ModelError(f"{st.source}: no encoder layers ('{prefix}layers.0.*')")
    if cfg["max_source_positions"] < 1:
        raise ModelError(f"{st.source}: max_source_positions {cfg['max_source_positions']}")
    return cfg


def _layer_indices(st, keys, prefix) -> set:
    """The encoder layer indices the tensor names give, which must be 0, 1, ..., n - 1: one tensor named
    with layer 1000000 would otherwise make the encoder a million layers deep before anything is refused."""
    layers = {}
    for k in keys:
        m = _LAYER.match(k[len(prefix):]) if k.startswith(prefix) else None
        if m:
            i = int(m.group(1)) if len(m.group(1)) <= 9 else 1 << 40
            layers.setdefault(i, k)
    n = len(layers)
    odd = sorted(i for i in layers if i >= n)
    if n > _CONFIG_LIMITS["encoder_layers"] or odd:
        first = layers[odd[0]] if odd else layers[max(layers)]
        raise ModelError(f"{st.source}: tensor '{first}' is of an encoder layer beyond the {n} layer(s) the "
                         f"checkpoint names ('{prefix}layers.N.*' must number the layers 0 to "
                         f"{min(n, _CONFIG_LIMITS['encoder_layers']) - 1}"
                         + (f", at most {_CONFIG_LIMITS['encoder_layers']}" if n > _CONFIG_LIMITS['encoder_layers']
                            else "") + ")")
    return set(layers)


def _inside_model_folder(path: Path, model: Path) -> None:
    """A file read beside a model must lie in the model's folder (the one it is named in, or the one the
    model file really is in, as in Hugging Face's cache of links into blobs/), not behind a link out of it."""
    target = path.resolve()
    folders = {Path(model).parent.resolve(), Path(model).resolve().parent}
    if not any(target.is_relative_to(f) for f in folders):
        raise ModelError(f"{path}: a link to '{target}', outside the model's folder; refused")


def encoder_param_shapes(cfg: dict) -> dict[str, tuple]:
    """The HF names (without prefix) and shapes of a Whisper encoder's parameters."""
    d, m, n = cfg["d_model"], cfg["num_mel_bins"], cfg["max_source_positions"]
    s = {"conv1.weight": (d, m, 3), "conv1.bias": (d,), "conv2.weight": (d, d, 3), "conv2.bias": (d,),
         "embed_positions.weight": (n, d)}
    for i in range(cfg["encoder_layers"]):
        p = f"layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[f"{p}self_attn.{proj}.weight"] = (d, d)
            if proj != "k_proj":
                s[f"{p}self_attn.{proj}.bias"] = (d,)
        for ln in ("self_attn_layer_norm", "final_layer_norm"):
            s[f"{p}{ln}.weight"], s[f"{p}{ln}.bias"] = (d,), (d,)
        s[f"{p}fc1.weight"], s[f"{p}fc1.bias"] = (4 * d, d), (4 * d,)
        s[f"{p}fc2.weight"], s[f"{p}fc2.bias"] = (d, 4 * d), (d,)
    s["layer_norm.weight"], s["layer_norm.bias"] = (d,), (d,)
    return s


def load_safetensors(path, max_load_bytes=None) -> Graph:
    st = SafetensorsFile(path)
    cfg = whisper_config(st, Path(path).parent / "config.json")
    prefix = cfg["prefix"]
    shapes = encoder_param_shapes(cfg)
    keys = set(st.keys())
    missing = [prefix + k for k in shapes if prefix + k not in keys]
    # under an explicit encoder prefix, or everything when there is none: all must be used
    ours = [k for k in keys if k.startswith(prefix)] if prefix else list(keys)
    unused = sorted(k for k in ours if k[len(prefix):] not in shapes)
    bad = [f"'{prefix + k}' is {list(st.shape(prefix + k))}, expected {list(s)}"
           for k, s in shapes.items() if prefix + k in keys and tuple(st.shape(prefix + k)) != s]
    problems = []
    what = (f"d_model {cfg['d_model']}, {cfg['encoder_layers']} layers, {cfg['num_mel_bins']} mel bins, "
            f"{cfg['max_source_positions']} positions (from {cfg['source']})")
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing: " + _some(missing))
    if unused:
        problems.append(f"{len(unused)} encoder tensor(s) this Whisper encoder does not use: " + _some(unused))
    if bad:
        problems.append("mis-shaped: " + "; ".join(bad[:8]) + (f"; ... ({len(bad) - 8} more)" if len(bad) > 8 else ""))
    if problems:
        raise ModelError(f"{st.source}: not a Whisper encoder checkpoint for {what}: " + "; ".join(problems))
    for k in shapes:
        if st.dtype(prefix + k) not in ("F32", "F16", "BF16", "F64"):
            raise ModelError(f"{st.source}: tensor '{prefix + k}' has dtype {st.dtype(prefix + k)}, "
                             f"expected a floating-point type")
    # read one tensor at a time: at large-v3 size a second copy of every weight would be 2.5 GB
    g = build_whisper_encoder_graph(cfg, lambda k: st.get(prefix + k), prefix=prefix, source=str(path))
    g.max_load_bytes = max_load_bytes
    return g


class _Builder:
    def __init__(self, g: Graph):
        self.g = g
        self.count: dict[str, int] = {}

    def op(self, op, inputs, scope, out=None, **attrs) -> str:
        base = f"{scope}/{op}"
        k = self.count.get(base, 0)
        self.count[base] = k + 1
        name = base if k == 0 else f"{base}_{k}"
        out = out or f"{name}_output_0"
        attrs["_opset"] = OPSET
        self.g.nodes.append(Node(op, name, list(inputs), [out], attrs))
        self.g.add_tensor(Tensor(out))
        return out

    def const(self, name, data) -> str:
        self.g.const(name, data)
        return name


def transposed_f32(w) -> np.ndarray:
    """A 2-D w [R, C] as a contiguous float32 [C, R], copied 64 rows of w at a time: one strided copy of the whole
    array reads across all of it for every output row, several times slower at a vocabulary projection's size."""
    w = np.asarray(w, np.float32)
    out = np.empty(w.shape[::-1], np.float32)
    for i in range(0, w.shape[0], 64):
        out[:, i:i + 64] = w[i:i + 64].T
    return out


def build_whisper_encoder_graph(cfg: dict, w, prefix: str = "", source: str = "<memory>", batch: int = 1,
                                transposed=None) -> Graph:
    """The encoder Graph from HF-named parameters `w` (a dict, or a function of the name; names without
    prefix, HF layouts: Linear weights [out, in]) for `batch` windows at once. Constants are named by their
    checkpoint names (prefix included); a Linear weight stored transposed for MatMul is named '<name>^T'.
    transposed: a function of a float Linear weight's name giving it [in, out], contiguous float32 (graphs built
    together share the copies, and the planner packs the same arrays once); None: a copy made here."""
    get = w.__getitem__ if isinstance(w, dict) else w
    d, h, m = cfg["d_model"], cfg["encoder_attention_heads"], cfg["num_mel_bins"]
    n_pos, n_layers = cfg["max_source_positions"], cfg["encoder_layers"]
    hd = d // h
    g = Graph(name="whisper_encoder", source=source)
    g.opset = OPSET
    b = _Builder(g)
    f32 = np.float32

    def param(k):
        return b.const(prefix + k, np.ascontiguousarray(get(k), f32))

    def linear(x, scope, k, bias=True):
        w = get(f"{k}.weight")
        if isinstance(w, QuantizedWeight):       # int8: kept int8 into the GEMM (planner/fold_dequantize_linear.py)
            q, s = w.kn()
            wt = b.op("DequantizeLinear", [b.const(f"{prefix}{k}.weight^T", q),
                                           b.const(f"{prefix}{k}.weight_scale", s)], scope, axis=1)
        else:
            kn = transposed_f32(w) if transposed is None else transposed(f"{k}.weight")
            wt = b.const(f"{prefix}{k}.weight^T", kn)
        y = b.op("MatMul", [x, wt], scope)
        return b.op("Add", [y, param(f"{k}.bias")], scope) if bias else y

    def layer_norm(x, scope, k, out=None):
        return b.op("LayerNormalization", [x, param(f"{k}.weight"), param(f"{k}.bias")], scope, out=out,
                    axis=-1, epsilon=LN_EPS)

    g.inputs.append("input_features")
    g.add_tensor(Tensor("input_features", (batch, m, 2 * n_pos), "float32"))
    x = "input_features"
    for name, stride in (("conv1", 1), ("conv2", 2)):
        x = b.op("Conv", [x, param(f"{name}.weight"), param(f"{name}.bias")], f"/{name}", dilations=[1], group=1,
                 kernel_shape=[3], pads=[1, 1], strides=[stride])
        x = b.op("Gelu", [x], f"/{name}", approximate="none")
    x = b.op("Transpose", [x], "", perm=[0, 2, 1])
    x = b.op("Add", [x, param("embed_positions.weight")], "")

    heads_shape = b.const("const_heads_shape", np.array([batch, n_pos, h, hd], np.int64))
    merge_shape = b.const("const_merge_shape", np.array([batch, n_pos, d], np.int64))
    scale = b.const("const_attn_scale", np.array(hd ** -0.5, f32))
    for i in range(n_layers):
        s, p = f"/layers.{i}", f"layers.{i}"
        sa = f"{s}/self_attn"
        hn = layer_norm(x, f"{s}/self_attn_layer_norm", f"{p}.self_attn_layer_norm")
        q = b.op("Mul", [linear(hn, f"{sa}/q_proj", f"{p}.self_attn.q_proj"), scale], sa)
        k = linear(hn, f"{sa}/k_proj", f"{p}.self_attn.k_proj", bias=False)
        v = linear(hn, f"{sa}/v_proj", f"{p}.self_attn.v_proj")
        q = b.op("Transpose", [b.op("Reshape", [q, heads_shape], sa)], sa, perm=[0, 2, 1, 3])   # [1, h, T, hd]
        kt = b.op("Transpose", [b.op("Reshape", [k, heads_shape], sa)], sa, perm=[0, 2, 3, 1])  # [1, h, hd, T]
        v = b.op("Transpose", [b.op("Reshape", [v, heads_shape], sa)], sa, perm=[0, 2, 1, 3])
        a = b.op("Softmax", [b.op("MatMul", [q, kt], sa)], sa, axis=-1)
        o = b.op("Transpose", [b.op("MatMul", [a, v], sa)], sa, perm=[0, 2, 1, 3])            # [1, T, h, hd]
        o = b.op("Reshape", [o, merge_shape], sa)
        x = b.op("Add", [x, linear(o, f"{sa}/out_proj", f"{p}.self_attn.out_proj")], s)
        hn = layer_norm(x, f"{s}/final_layer_norm", f"{p}.final_layer_norm")
        hn = b.op("Gelu", [linear(hn, f"{s}/fc1", f"{p}.fc1")], s, approximate="none")
        x = b.op("Add", [x, linear(hn, f"{s}/fc2", f"{p}.fc2")], s)
    layer_norm(x, "/layer_norm", "layer_norm", out="last_hidden_state")
    g.outputs.append("last_hidden_state")
    return g
