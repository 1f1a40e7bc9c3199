"""minirt: a minimal inference runtime for ONNX and safetensors models on Vulkan compute."""
from .errors import DeviceError, InputError, MinirtError, ModelError, UnsupportedError
from .session import Session

__version__ = "0.1.0"
__all__ = ["Session", "MinirtError", "ModelError", "UnsupportedError", "InputError", "DeviceError", "__version__"]
