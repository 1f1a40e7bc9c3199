"""Zero-copy outputs (buffer storage, VK_EXT_external_memory_host): ZERO_COPY_SLOTS sets of numpy arrays whose
memory the GPU copies the outputs into, each with its own recorded command buffer. A run uses a set no caller still
holds (CPython reference counts of the arrays and of the memory they view) and returns its arrays as they are: no
host copy of the result. When every set is held, the run falls back to the readback buffers and a copy."""
from __future__ import annotations

import sys

import numpy as np

from ..errors import DeviceError

ZERO_COPY_SLOTS = 3     # output sets a caller may hold while runs still return without a copy
ZERO_COPY_MAX_BYTES = 64 << 20   # above this (all outputs together), one slot


def make_slots(res) -> list:
    """[{"out": {name: (VkBuffer, array)}, "items": [(name, array, raw memory)], "base": refs(items)}], or [] where
    the plan asks for none (plan.zero_copy) or the driver cannot import host memory for these outputs."""
    vk, dev, plan = res.vk, res.dev, res.plan
    align = getattr(dev, "host_import_alignment", 0)
    names = list(res.outputs)
    if (not plan.zero_copy or not align or dev.host_pointer_properties is None or plan.storage != "buffer"
            or not names or any(n in res.direct or res.where[n][0] != "buffer" for n in names)):
        return []
    total = sum(plan.tensors[n].nbytes for n in names)
    slots = []
    # big outputs get one slot: host memory for three copies of them is not worth a saved copy
    for _ in range(ZERO_COPY_SLOTS if total <= ZERO_COPY_MAX_BYTES else 1):
        out, items = {}, []
        for n in names:
            t = plan.tensors[n]
            size = max(-(-t.nbytes // align) * align, align)     # a zero-size buffer is invalid Vulkan
            raw = np.empty(size + align, np.uint8)
            res.imported.append(raw)
            off = (-raw.ctypes.data) % align
            arr = raw[off:off + t.nbytes].view(np.float32).reshape(t.shape)
            buf = import_host(res, raw.ctypes.data + off, size, vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, f"output '{n}'")
            if buf is None:
                return []    # the driver refuses this import: outputs are copied (the buffers made go at close)
            out[n] = (buf, arr)
            items.append((n, arr, raw))
        slots.append({"out": out, "items": items})
        del arr, raw          # the baseline counts must not include this function's own names
    for slot in slots:
        slot["base"] = refs(slot["items"])
    return slots


def refs(items):
    """CPython reference counts of a slot's arrays and of the memory they view: a caller holding an output, or any
    view of it (numpy views reference the owner of the memory), raises one of them."""
    return [(sys.getrefcount(arr), sys.getrefcount(raw)) for _, arr, raw in items]


def import_host(res, addr, size, usage, what):
    """A VkBuffer on `size` bytes of this process's memory at `addr` (both multiples of the device's import
    alignment), in a host-coherent memory type so that neither side needs a flush; None where the driver refuses.
    Destroyed at close; the memory must stay allocated until then."""
    vk, dev, ffi, d = res.vk, res.dev, res.vk.ffi, res.d
    handle = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
    ptr = ffi.cast("void *", addr)
    ext = ffi.new("VkExternalMemoryBufferCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, "handleTypes": handle})
    buf = res.own(vk.vkDestroyBuffer, vk.vkCreateBuffer(d, vk.VkBufferCreateInfo(
        pNext=ext, size=size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None))
    props = ffi.new("VkMemoryHostPointerPropertiesEXT*",
                    {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT})
    if dev.host_pointer_properties(d, handle, ptr, props) != vk.VK_SUCCESS:
        return None
    req = vk.vkGetBufferMemoryRequirements(d, buf)
    bits = props.memoryTypeBits & req.memoryTypeBits
    coherent = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
    types = [i for i in range(dev.mem_props.memoryTypeCount)
             if bits & (1 << i) and dev.mem_props.memoryTypes[i].propertyFlags & coherent]
    if not types or req.size > size:
        return None
    imp = ffi.new("VkImportMemoryHostPointerInfoEXT*", {
        "sType": vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, "handleType": handle, "pHostPointer": ptr})
    try:
        mem = vk.vkAllocateMemory(d, vk.VkMemoryAllocateInfo(pNext=imp, allocationSize=size,
                                                            memoryTypeIndex=types[0]), None)
    except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as e:
        raise DeviceError(f"out of memory importing {size / 2**20:.1f} MiB of host memory for {what} "
                          f"on '{dev.profile.name}' ({type(e).__name__})") from None
    except vk.VkError:
        return None
    res.own(vk.vkFreeMemory, mem)
    vk.vkBindBufferMemory(d, buf, mem, 0)
    return buf
