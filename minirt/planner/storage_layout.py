"""Storage and layout: where tensors live and which dim shares a texel.

Textures suit mobile GPUs (Adreno, Mali, PowerVR: texture caches, fast sampled reads); buffers
suit desktop GPUs and CPUs. In textures, NCHW (rank-4) tensors are channels-packed and everything
else (matrices, sequences) width-packed; buffers are dense row-major, packed along W.

Mixed storage: storage="auto" on a device whose table says textures plans every tensor as a texture where its image
fits the device (DeviceProfile.max_image_3d, maxImageDimension3D) and runs the nodes around one that does not in
buffers: a node that reads or writes a graph tensor too large for an image (a vocabulary-wide logits row), a node
whose lowering would make such a texture (a temporary), and a node that has no texture kernel for what it is given.
Where a tensor made in one storage is read by a node of the other, the lowering adds a copy into that storage
(glsl/storage_copy.comp; constants are uploaded in both instead), and the Plan's notes name each buffer node and why.
Only an explicit storage="texture" refuses a tensor too large for an image."""
from __future__ import annotations

from ..errors import MinirtError, UnsupportedError
from ..options import STORAGES
from ..plan import texel_extents


def resolve_storage(storage: str, profile) -> str:
    """"auto" becomes the device table's storage (DeviceProfile.tuning)."""
    if storage not in STORAGES:
        raise MinirtError(f"storage must be one of {', '.join(STORAGES)}, got {storage!r}")
    return profile.tuning.storage if storage == "auto" else storage


def packed_dim_for(shape, storage: str) -> int:
    if storage == "texture" and len(shape) == 4:
        return 2
    return 0


def texture_extents(shape) -> tuple[int, int, int]:
    """The image extents a tensor of `shape` takes as a texture."""
    return texel_extents(shape, packed_dim_for(shape, "texture"))


def too_large(extents, profile) -> str | None:
    """Why an image of these extents cannot be made on the device, or None where it can."""
    if max(extents) > profile.max_image_3d:
        return (f"needs a texture of extents {tuple(extents)}, beyond this device's limit of {profile.max_image_3d} "
                f"(maxImageDimension3D)")
    return None


def buffer_nodes(graph, profile) -> dict[str, str]:
    """Mixed storage: node name -> why it runs in buffers, for every node that reads or writes a graph tensor whose
    texture the device cannot make. Constants are left to the lowering: most become prepacked weights, which are
    buffers in both storages, and a node that makes a texture of one is moved then (lower.lower_mixed)."""
    wide = {}
    for name, t in graph.tensors.items():
        if t.is_static and not t.is_const and len(t.shape) <= 4:
            why = too_large(texture_extents(t.shape), profile)
            if why:
                wide[name] = f"tensor '{name}' {list(t.shape)} {why}"
    out = {}
    for node in graph.nodes:
        hit = next((n for n in [*node.inputs, *node.outputs] if n in wide), None)
        if hit:
            out[node.name] = wide[hit]
    return out


def check_limits(plan, profile) -> None:
    """Refuse a plan whose textures exceed the device's image size limit, naming the tensor."""
    for t in plan.tensors.values():
        if t.storage == "texture" and not t.view_of:
            why = too_large(t.texel_extents, profile)
            if why:
                raise UnsupportedError(f"tensor '{t.name}' {list(t.shape)} {why}; use storage='auto' (buffers where "
                                       f"textures do not fit) or storage='buffer'")
