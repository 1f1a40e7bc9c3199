"""Exceptions. Each names the file, node, op or tensor at fault so a user can act on it."""


class MinirtError(Exception):
    """Base class for every error minirt raises on purpose."""


class ModelError(MinirtError):
    """The model file or graph is malformed, cyclic, or refers to something that is not there."""


class UnsupportedError(ModelError):
    """The model uses ops, dtypes or shapes that minirt does not run."""

    def __init__(self, message, items=()):
        super().__init__(message)
        self.items = list(items)


class InputError(MinirtError):
    """A run was given inputs with a wrong name, shape or dtype."""


class DeviceError(MinirtError):
    """No usable Vulkan driver or device, or the device failed (out of memory, lost)."""


class NondeterminismError(MinirtError):
    """Repeated runs of the same input gave different outputs."""


class OptionError(InputError, ValueError):
    """An option of a call has the wrong type or value (the message names the option). A ValueError too, as
    Python's own checks of an argument's value are."""
