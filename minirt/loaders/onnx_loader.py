"""ONNX -> Graph. Initializers and Constant nodes become constants; external data is read only
from inside the model's folder."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError, UnsupportedError
from ..graph import Graph, Node, Tensor

_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.INT64: "int64",
           onnx.TensorProto.INT32: "int32", onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BOOL: "bool",
           onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8"}


# bytes per element of the numeric TensorProto data types (for sizes told before reading any data)
_ITEMSIZE = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.UINT8: 1, onnx.TensorProto.INT8: 1, onnx.TensorProto.UINT16: 2,
             onnx.TensorProto.INT16: 2, onnx.TensorProto.INT32: 4, onnx.TensorProto.INT64: 8, onnx.TensorProto.BOOL: 1,
             onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.DOUBLE: 8, onnx.TensorProto.UINT32: 4,
             onnx.TensorProto.UINT64: 8, onnx.TensorProto.BFLOAT16: 2}
# INT4 / UINT4 (opset 21's 4-bit weights of a DequantizeLinear): read as ml_dtypes' int4 / uint4 arrays (a value a
# byte), which only fold_dequantize_linear turns into GPU weights
_PACKED4 = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
_INTERNAL_DOMAIN = "minirt"    # the planner's own fused ops (Linear, Attention, ...): never from a file


def load_onnx(model, weights=None, max_load_bytes=None) -> Graph:
    base, source = None, "<ModelProto>"
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray, memoryview)):
        source = "<bytes>"
        try:
            proto = onnx.load_model_from_string(bytes(model))
        except Exception as e:
            raise ModelError(f"{source}: not a valid ONNX model ({e})") from None
    else:
        path = Path(model)
        source = str(path)
        if not path.is_file():
            raise ModelError(f"{source}: no such model file")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as e:
            raise ModelError(f"{source}: not a valid ONNX model ({type(e).__name__}: {e})") from None
        base = path.resolve().parent
    g = Graph(name=proto.graph.name, source=source, max_load_bytes=max_load_bytes)
    g.opset = _check_versions(proto, source)
    if not proto.graph.output:
        raise ModelError(f"{source}: the graph has no outputs" + ("" if proto.graph.node else " (it is empty)"))
    defined = {}    # tensor name -> what defines it: in ONNX every name is defined once
    types = {}      # tensor name -> ONNX type string ("tensor(float)"), where known at load: _check_types

    def define(name, what):
        if not name:
            raise ModelError(f"{source}: {what} defines a tensor with an empty name")
        if name in defined:
            raise ModelError(f"{source}: tensor '{name}' is defined twice, by {defined[name]} and by {what}")
        defined[name] = what

    for init in proto.graph.initializer:
        define(_text(init.name, source, "an initializer name"), "an initializer")
        g.const(init.name, _tensor_data(init, base, source))
        types[init.name] = _type_str(init.data_type)
    if weights is not None:
        from .safetensors_loader import apply_weights
        apply_weights(g, weights)
    for vi in proto.graph.input:
        _text(vi.name, source, "an input name")
        if vi.name in g.tensors and defined.get(vi.name) == "an initializer":
            continue   # an initializer listed as input (old exporters): a constant
        define(vi.name, "a graph input")
        g.inputs.append(vi.name)
        g.add_tensor(Tensor(vi.name, *_value_info(vi, source)))
        types[vi.name] = _type_str(vi.type.tensor_type.elem_type)
    for i, n in enumerate(proto.graph.node):
        _text(n.op_type, source, "an op type")
        _text(n.domain, source, "a domain")
        for t in (*n.input, *n.output, n.name):
            _text(t, source, "a tensor or node name")
        name = n.name or f"{n.op_type}_{i}"
        if n.domain == _INTERNAL_DOMAIN:
            # their invariants (shapes, layouts, attributes) hold by construction in the planner, and
            # nothing checks them: a file's Linear with the wrong K would read past its input on the GPU
            raise ModelError(f"{source}: {n.op_type} node '{name}' is in domain '{_INTERNAL_DOMAIN}', minirt's "
                             f"internal ops, which only its planner makes; a model file may not use them")
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            if len(n.output) != 1:
                raise ModelError(f"{source}: Constant node '{name}' has {len(n.output)} outputs, not 1")
            define(n.output[0], f"Constant node '{name}'")
            value = _constant_value(n, name, base, source)
            g.const(n.output[0], value)
            types[n.output[0]] = _type_str(_ONNX_OF.get(value.dtype.name, onnx.TensorProto.UNDEFINED))
            continue
        _check_schema(n, name, g.opset, source, proto.ir_version, types)
        attrs = {_text(a.name, source, "an attribute name"): _attr(a, base, source, f"{n.op_type} node '{name}'")
                 for a in n.attribute}
        attrs["_opset"] = g.opset   # for ops whose meaning changed between opsets (Softmax < 13)
        g.nodes.append(Node(n.op_type, name, list(n.input), list(n.output), attrs, n.domain))
        for o in n.output:
            if o:
                define(o, f"{n.op_type} node '{name}'")
                g.add_tensor(Tensor(o))
    for vi in proto.graph.output:
        g.outputs.append(_text(vi.name, source, "an output name"))
        if vi.name not in g.tensors:
            raise ModelError(f"{source}: graph output '{vi.name}' is produced by no node")
    for n in g.nodes:
        for i in n.inputs:
            if i and i not in g.tensors:
                raise ModelError(f"{source}: {n.op} node '{n.name}' reads '{i}', which no node, input or "
                                 f"initializer defines")
    return g


def _check_versions(proto, source) -> int:
    """The model's ONNX opset, after checking its IR version and opsets are ones the installed onnx
    package knows (a later one may change what an op means: onnx.checker's rule)."""
    ir, newest_ir = proto.ir_version, onnx.IR_VERSION
    if not 1 <= ir <= newest_ir:
        raise ModelError(f"{source}: ir_version {ir}; the installed onnx {onnx.__version__} reads IR versions "
                         f"1 to {newest_ir}")
    newest, opset = onnx.defs.onnx_opset_version(), None
    for o in proto.opset_import:
        domain = _text(o.domain, source, "an opset domain")
        if domain in ("", "ai.onnx"):
            if opset is not None and o.version != opset:
                raise ModelError(f"{source}: imports ONNX opsets {opset} and {o.version}")
            if not 1 <= o.version <= newest:
                raise ModelError(f"{source}: imports ONNX opset {o.version}; the installed onnx "
                                 f"{onnx.__version__} knows opsets 1 to {newest}")
            opset = o.version
    if opset is None and ir >= 3 and any(n.domain in ("", "ai.onnx") for n in proto.graph.node):
        raise ModelError(f"{source}: imports no ONNX opset (opset_import), which IR version {ir} requires")
    return opset or 0


def _type_str(elem_type) -> str | None:
    """ONNX's type string for a tensor element type ("tensor(float)"), None for UNDEFINED or unknown."""
    try:
        name = onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return None
    return None if name == "UNDEFINED" else f"tensor({name.lower()})"


_ONNX_OF = {v: k for k, v in _DTYPES.items()}     # numpy dtype name -> TensorProto data type


def _value_info(vi, source):
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedError(f"{source}: input '{vi.name}' is a {vi.type.WhichOneof('value') or 'typeless'} "
                               f"value; minirt's inputs are tensors")
    tt = vi.type.tensor_type
    if tt.elem_type == onnx.TensorProto.UNDEFINED:
        raise ModelError(f"{source}: input '{vi.name}' has no element type (UNDEFINED)")
    dtype = _DTYPES.get(tt.elem_type)
    if dtype is None:
        what = _type_str(tt.elem_type) or f"element type {tt.elem_type}"
        raise UnsupportedError(f"{source}: input '{vi.name}' is {what}; minirt's inputs are float32, integer or bool tensors")
    if not tt.HasField("shape"):
        return None, dtype
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ModelError(f"{source}: '{vi.name}' declares shape {list(dims)}, with a negative dimension")
    return dims, dtype


def _tensor_data(t, base, source) -> np.ndarray:
    """A TensorProto's data as a numpy array; sizes are checked against what holds the data before reading."""
    name = _text(t.name, source, "a tensor name")
    if t.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING) or _type_str(t.data_type) is None:
        raise UnsupportedError(f"{source}: tensor '{name}' has data type "
                               f"{_type_str(t.data_type) or t.data_type}, which minirt does not load")
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise ModelError(f"{source}: tensor '{name}' has dims {dims}, with a negative dimension")
    numel = 1
    for d in dims:
        numel *= d
    want = numel * _ITEMSIZE[t.data_type] if t.data_type in _ITEMSIZE else None
    if t.data_type in _PACKED4:       # two 4-bit values a byte
        want = (numel + 1) // 2
    if t.data_location == onnx.TensorProto.EXTERNAL:
        t = _external(t, name, want, base, source)
    try:
        return numpy_helper.to_array(t).copy()
    except Exception as e:        # a size that does not match the dims, a broken encoding, out of memory
        raise ModelError(f"{source}: tensor '{name}' is corrupt ({type(e).__name__}: {e})") from None


def _external(t, name, want, base, source):
    """A copy of tensor t with its external data read in, from inside the model's folder only."""
    info = {e.key: e.value for e in t.external_data}
    if base is None:
        raise ModelError(f"{source}: tensor '{name}' uses external data, which needs the model loaded from a path")
    loc = info.get("location", "")
    try:
        target = (base / loc).resolve()
        inside = bool(loc) and not os.path.isabs(loc) and target.is_relative_to(base)
    except (OSError, ValueError, RuntimeError):       # a NUL in the name, a symlink loop
        inside = False
    if not inside:
        raise ModelError(f"{source}: tensor '{name}' points at external data '{loc}' outside the model's "
                         f"folder; refused")
    if not target.is_file():
        raise ModelError(f"{source}: external data file '{loc}' of tensor '{name}' is missing")
    size = target.stat().st_size
    try:
        off = int(info.get("offset") or 0)
        length = int(info["length"]) if info.get("length") else size - off
    except ValueError:
        shown = [repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "..." for v in (info.get("offset"),
                                                                                   info.get("length"))]
        raise ModelError(f"{source}: tensor '{name}' has an invalid external data offset or length "
                         f"({shown[0]}, {shown[1]})") from None
    # told from the file's size, before reading: a huge or negative offset or length is never passed on
    if off < 0 or length < 0 or off + length > size:
        raise ModelError(f"{source}: tensor '{name}' has an invalid external data offset or length: bytes "
                         f"[{off}, {off + length}) of '{loc}', which holds {size} bytes")
    if want is not None and length != want:
        raise ModelError(f"{source}: tensor '{name}' is corrupt: its external data is {length} bytes of '{loc}' "
                         f"but its dims {list(t.dims)} need {want}")
    try:
        with open(target, "rb") as f:
            f.seek(off)
            raw = f.read(length)
    except (OSError, MemoryError, OverflowError) as e:
        raise ModelError(f"{source}: cannot read external data '{loc}' of tensor '{name}' "
                         f"({type(e).__name__}: {e})") from None
    if len(raw) != length:
        raise ModelError(f"{source}: external data '{loc}' of tensor '{name}' ended after {len(raw)} of "
                         f"{length} bytes")
    t2 = onnx.TensorProto()
    t2.CopyFrom(t)
    del t2.external_data[:]
    t2.data_location = onnx.TensorProto.DEFAULT
    t2.raw_data = raw
    return t2


def _constant_value(n, name, base, source):
    for a in n.attribute:
        if a.name == "value":
            return _tensor_data(a.t, base, source)
        if a.name in ("value_float", "value_int"):
            return np.array(helper.get_attribute_value(a), np.float32 if a.name == "value_float" else np.int64)
        if a.name in ("value_floats", "value_ints"):
            return np.array(list(helper.get_attribute_value(a)), np.float32 if a.name == "value_floats" else np.int64)
    raise ModelError(f"{source}: Constant node '{name}' has no value minirt understands")


def _attr(a, base, source, where=""):
    if a.type == onnx.AttributeProto.TENSOR:
        return _tensor_data(a.t, base, source)
    if a.type == onnx.AttributeProto.UNDEFINED or a.type not in onnx.AttributeProto.AttributeType.values():
        raise ModelError(f"{source}: attribute '{_text(a.name, source, 'an attribute name')}' of {where} has no "
                         f"valid type ({a.type})")
    try:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, (list, tuple)):
            return [x.decode() if isinstance(x, bytes) else x for x in v]
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelError(f"{source}: attribute '{a.name}' of {where} is corrupt ({e})") from None
    return v


def _check_schema(n, name, opset, source, ir_version, types):
    """An ONNX op's node must have as many inputs and outputs as its schema allows, attributes of the
    types it gives (an INTS where an INT belongs would otherwise reach the op's code as a list), the rest
    of onnx.checker's rules for a node, and inputs of the types its constraints allow (an int64 or
    float64 initializer is not a MatMul's float weight, a float tensor not a Reshape's shape).
    `types` (tensor name -> ONNX type string) gains the node's output types where they follow."""
    from .. import ops
    schema = None
    if n.domain in ("", "ai.onnx"):
        try:
            schema = onnx.defs.get_schema(n.op_type, max(int(opset), 1), "")
        except Exception:    # not an ONNX op, or not at this opset: the op registry reports it
            schema = None
    if schema is None or ops.get(n.op_type, n.domain) is None:
        return               # an op minirt does not run: prepare() lists all of those at once
    for what, have, lo, hi in (("inputs", n.input, schema.min_input, schema.max_input),
                               ("outputs", n.output, schema.min_output, schema.max_output)):
        count = len(have)
        while count and not have[count - 1]:      # trailing "" are omitted optional ones
            count -= 1
        if not lo <= count <= hi:
            want = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi < 2**31 - 1 else f"at least {lo}"
            raise ModelError(f"{source}: {n.op_type} node '{name}' has {count} {what}; ONNX (opset {opset}) "
                             f"takes {want}")
    for a in n.attribute:
        spec = schema.attributes.get(a.name)
        if spec is not None and int(spec.type) != a.type:
            names = {v: k for k, v in onnx.AttributeProto.AttributeType.items()}
            raise ModelError(f"{source}: attribute '{a.name}' of {n.op_type} node '{name}' is "
                             f"{names.get(a.type, a.type)}; ONNX says {names.get(int(spec.type), spec.type)}")
    try:
        onnx.checker.check_node(n, _checker_context(ir_version, max(int(opset), 1)))
    except Exception as e:   # onnx.checker.ValidationError: required or unknown attributes, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{source}: {n.op_type} node '{name}' is not valid ONNX (opset {opset}): {first}") \
            from None
    _check_types(n, name, schema, opset, source, types)


@functools.lru_cache(maxsize=8)
def _checker_context(ir_version, opset):
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = ir_version
    ctx.opset_imports = {"": opset, "ai.onnx": opset}
    return ctx


def _check_types(n, name, schema, opset, source, types):
    """ONNX's type constraints on the node's inputs whose types are known at load (graph inputs,
    initializers, Constants and what follows from them); records its outputs' types where they follow."""
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    formal, bound = list(schema.inputs), {}     # type parameter -> (type, the tensor that set it)
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    for i, t in enumerate(n.input):
        if not t or not formal or types.get(t) is None:
            continue
        p = formal[min(i, len(formal) - 1)]
        if i >= len(formal) and p.option != variadic:
            continue
        have = types[t]
        allowed = constraints.get(p.type_str, {p.type_str})
        if have not in allowed:
            raise ModelError(f"{source}: input '{t}' of {n.op_type} node '{name}' is {_shown(have)}; ONNX's "
                             f"{n.op_type} (opset {opset}) takes " + ", ".join(sorted(_shown(x) for x in allowed))
                             + f" as its '{p.name}'")
        if p.type_str not in constraints or (p.option == variadic and not p.is_homogeneous):
            continue
        prev = bound.setdefault(p.type_str, (have, t))
        if prev[0] != have:
            raise ModelError(f"{source}: {n.op_type} node '{name}' mixes {_shown(prev[0])} '{prev[1]}' and "
                             f"{_shown(have)} '{t}', which ONNX's type constraint {p.type_str} makes one type")
    for j, o in enumerate(n.output):
        if not o or not schema.outputs:
            continue
        p = schema.outputs[min(j, len(schema.outputs) - 1)]
        if n.op_type == "Cast" and j == 0:
            to = next((a.i for a in n.attribute if a.name == "to"), 0)
            types[o] = _type_str(to)
        elif p.type_str in bound:
            types[o] = bound[p.type_str][0]
        elif p.type_str not in constraints:
            types[o] = p.type_str
        elif len(constraints[p.type_str]) == 1:
            types[o] = next(iter(constraints[p.type_str]))


def _shown(type_str):
    """'tensor(float)' -> 'float32', the loader's name where it has one."""
    inner = type_str[len("tensor("):-1] if type_str.startswith("tensor(") else type_str
    return {"float": "float32", "double": "float64"}.get(inner, inner)


def _text(v, source, what):
    """A name from the protobuf: the python protobuf runtime hands invalid UTF-8 back as bytes."""
    if not isinstance(v, str):
        raise ModelError(f"{source}: {what} {v!r} is not valid UTF-8 text")
    return v
