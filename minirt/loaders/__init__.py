"""Loaders turn a model file into a Graph. They never touch Vulkan."""
from __future__ import annotations

import os


def load(model, weights=None):
    """A Graph from an ONNX path, bytes or ModelProto, or a safetensors checkpoint path."""
    if isinstance(model, (str, os.PathLike)) and str(model).endswith(".safetensors"):
        if weights is not None:
            from ..errors import ModelError
            raise ModelError(f"{model}: weights= applies to ONNX models; a safetensors checkpoint carries "
                             f"its own weights")
        from .safetensors_loader import load_safetensors
        return load_safetensors(model)
    from .onnx_loader import load_onnx
    import onnx
    if not isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview, onnx.ModelProto)):
        from ..errors import ModelError
        raise ModelError(f"a model is an ONNX or safetensors path, ONNX bytes or an onnx.ModelProto; got "
                         f"{type(model).__name__}")
    return load_onnx(model, weights=weights)
