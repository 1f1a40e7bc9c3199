"""Loaders turn a model file into a Graph. They never touch Vulkan."""
from __future__ import annotations

import os


def load(model, weights=None):
    """A Graph from an ONNX path, bytes or ModelProto, or a safetensors checkpoint path."""
    if isinstance(model, (str, os.PathLike)) and str(model).endswith(".safetensors"):
        from .safetensors_loader import load_safetensors
        return load_safetensors(model)
    from .onnx_loader import load_onnx
    return load_onnx(model, weights=weights)
