"""Storage and layout: where tensors live and which dim shares a texel.

Textures suit mobile GPUs (Adreno, Mali, PowerVR: texture caches, fast sampled reads); buffers
suit desktop GPUs and CPUs. In textures, NCHW (rank-4) tensors are channels-packed and everything
else (matrices, sequences) width-packed; buffers are dense row-major, packed along W."""
from __future__ import annotations

from ..errors import MinirtError, UnsupportedError
from ..options import STORAGES


def resolve_storage(storage: str, profile) -> str:
    """"auto" becomes the device table's storage (DeviceProfile.tuning)."""
    if storage not in STORAGES:
        raise MinirtError(f"storage must be one of {', '.join(STORAGES)}, got {storage!r}")
    return profile.tuning.storage if storage == "auto" else storage


def packed_dim_for(shape, storage: str) -> int:
    if storage == "texture" and len(shape) == 4:
        return 2
    return 0


def check_limits(plan, profile) -> None:
    """Refuse a plan whose textures exceed the device's image size limit, naming the tensor."""
    if plan.storage != "texture":
        return
    for t in plan.tensors.values():
        if t.storage == "texture" and not t.view_of and max(t.texel_extents) > profile.max_image_3d:
            raise UnsupportedError(
                f"tensor '{t.name}' {list(t.shape)} needs a texture of extents {t.texel_extents}, beyond this "
                f"device's limit of {profile.max_image_3d}; use storage='buffer'")
