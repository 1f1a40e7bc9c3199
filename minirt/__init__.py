"""minirt: a minimal inference runtime for ONNX and safetensors models on Vulkan compute."""
from .errors import DeviceError, InputError, MinirtError, ModelError, UnsupportedError
from .session import Session
from .version import __version__

__all__ = ["Session", "MinirtError", "ModelError", "UnsupportedError", "InputError", "DeviceError", "__version__"]
