"""ONNX -> Graph. Initializers and Constant nodes become constants; external data is read only
from inside the model's folder."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError
from ..graph import Graph, Node, Tensor

_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.INT64: "int64",
           onnx.TensorProto.INT32: "int32", onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BOOL: "bool",
           onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8"}


def load_onnx(model, weights=None) -> Graph:
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
    g = Graph(name=proto.graph.name, source=source)
    g.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{source}: the model has an empty graph")
    defined = {}    # tensor name -> what defines it: in ONNX every name is defined once

    def define(name, what):
        if not name:
            raise ModelError(f"{source}: {what} defines a tensor with an empty name")
        if name in defined:
            raise ModelError(f"{source}: tensor '{name}' is defined twice, by {defined[name]} and by {what}")
        defined[name] = what

    for init in proto.graph.initializer:
        define(_text(init.name, source, "an initializer name"), "an initializer")
        g.const(init.name, _tensor_data(init, base, source))
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
    for i, n in enumerate(proto.graph.node):
        _text(n.op_type, source, "an op type")
        _text(n.domain, source, "a domain")
        for t in (*n.input, *n.output, n.name):
            _text(t, source, "a tensor or node name")
        name = n.name or f"{n.op_type}_{i}"
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            if len(n.output) != 1:
                raise ModelError(f"{source}: Constant node '{name}' has {len(n.output)} outputs, not 1")
            define(n.output[0], f"Constant node '{name}'")
            g.const(n.output[0], _constant_value(n, name, base, source))
            continue
        _check_schema(n, name, g.opset, source)
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


def _value_info(vi, source):
    tt = vi.type.tensor_type
    dtype = _DTYPES.get(tt.elem_type)
    if not tt.HasField("shape"):
        return None, dtype
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ModelError(f"{source}: '{vi.name}' declares shape {list(dims)}, with a negative dimension")
    return dims, dtype


def _tensor_data(t, base, source) -> np.ndarray:
    if t.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in t.external_data}
        if base is None:
            raise ModelError(f"{source}: tensor '{t.name}' uses external data, which needs the model loaded from a path")
        loc = info.get("location", "")
        target = (base / loc).resolve()
        if os.path.isabs(loc) or not target.is_relative_to(base):
            raise ModelError(f"{source}: tensor '{t.name}' points at external data '{loc}' outside the model's "
                             f"folder; refused")
        if not target.is_file():
            raise ModelError(f"{source}: external data file '{loc}' of tensor '{t.name}' is missing")
        try:
            off = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else -1
            if off < 0 or length < -1:
                raise ValueError("negative")
        except ValueError:
            raise ModelError(f"{source}: tensor '{t.name}' has an invalid external data offset or length "
                             f"({info.get('offset')!r}, {info.get('length')!r})") from None
        try:
            with open(target, "rb") as f:
                f.seek(off)
                raw = f.read(length)
        except OSError as e:
            raise ModelError(f"{source}: cannot read external data '{loc}' of tensor '{t.name}' ({e})") from None
        t2 = onnx.TensorProto()
        t2.CopyFrom(t)
        del t2.external_data[:]
        t2.data_location = onnx.TensorProto.DEFAULT
        t2.raw_data = raw
        t = t2
    try:
        return numpy_helper.to_array(t).copy()
    except Exception as e:
        raise ModelError(f"{source}: tensor '{t.name}' is corrupt ({e})") from None


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


def _check_schema(n, name, opset, source):
    """An ONNX op's node must have as many inputs and outputs as its schema allows, and attributes of
    the types it gives (an INTS where an INT belongs would otherwise reach the op's code as a list)."""
    from .. import ops
    if n.domain not in ("", "ai.onnx") or ops.get(n.op_type, n.domain) is None:
        return               # an op minirt does not run: prepare() lists all of those at once
    try:
        schema = onnx.defs.get_schema(n.op_type, max(int(opset), 1), "")
    except Exception:        # not an ONNX op, or not at this opset: the op registry reports it
        return
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


def _text(v, source, what):
    """A name from the protobuf: the python protobuf runtime hands invalid UTF-8 back as bytes."""
    if not isinstance(v, str):
        raise ModelError(f"{source}: {what} {v!r} is not valid UTF-8 text")
    return v
