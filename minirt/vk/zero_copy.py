"""Zero-copy outputs (buffer storage, VK_EXT_external_memory_host): the executor's output sets (outputs.py) as numpy
arrays whose memory the GPU copies the outputs into, each set with its own recorded command buffer. A run uses a set no
caller still holds and returns its arrays as they are: no host copy of the result. When every set is held, the run
copies out of the readback buffers into a fresh array (outputs.py)."""
from __future__ import annotations

import numpy as np

from ..errors import DeviceError
from .outputs import refs, set_count


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
    for _ in range(set_count(total)):
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
