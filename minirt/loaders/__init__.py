"""Loaders turn a model file into a Graph. They never touch Vulkan.

What loading may allocate is bounded: the loaders read only what their files hold (every offset, length
and shape is checked against the file before reading), and the constants that load-time folding makes
count against one limit, MAX_LOAD_BYTES (1 GiB; `max_load_bytes=` overrides it per model)."""
from __future__ import annotations

import os

from ..graph import MAX_LOAD_BYTES

__all__ = ["MAX_LOAD_BYTES", "load"]


def load(model, weights=None, max_load_bytes=None):
    """A Graph from an ONNX path, bytes or ModelProto, or a safetensors checkpoint path.

    max_load_bytes: the most bytes of constants loading may make beyond what the files hold (load-time
    folding, summed over the graph); None for MAX_LOAD_BYTES. Every error is a minirt.errors.ModelError
    (or UnsupportedError) naming the file and what in it is at fault."""
    from ..errors import MinirtError, ModelError
    if max_load_bytes is not None and (isinstance(max_load_bytes, bool) or not isinstance(max_load_bytes, int)
                                       or max_load_bytes < 0):
        raise MinirtError(f"max_load_bytes must be a non-negative integer (bytes) or None, got {max_load_bytes!r}")
    source = str(model) if isinstance(model, (str, os.PathLike)) else f"<{type(model).__name__}>"
    try:
        if isinstance(model, (str, os.PathLike)) and str(model).endswith(".safetensors"):
            if weights is not None:
                raise ModelError(f"{model}: weights= applies to ONNX models; a safetensors checkpoint carries "
                                 f"its own weights")
            from .safetensors_loader import load_safetensors
            return load_safetensors(model, max_load_bytes=max_load_bytes)
        from .onnx_loader import load_onnx
        import onnx
        if not isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto)):
            raise ModelError(f"a model is an ONNX or safetensors path, ONNX bytes or an onnx.ModelProto; got "
                             f"{type(model).__name__}")
        return load_onnx(model, weights=weights, max_load_bytes=max_load_bytes)
    except MinirtError:
        raise
    except Exception as e:
        # the loaders name what is wrong where they can tell; anything else a file provokes from numpy,
        # onnx or the OS (out of memory, an overflow, a value out of range) is still the model's fault
        raise ModelError(f"{source}: cannot load the model ({type(e).__name__}: {e})") from e
