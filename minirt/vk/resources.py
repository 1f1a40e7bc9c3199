"""The Vulkan objects of one executor and where each tensor of its plan lives.

Every buffer, memory, image, view, sampler, pool and fence an executor creates goes through Resources.own: destroyed
in reverse order at close, and counted in live_objects() meanwhile (tests check that the count returns to where it
started). Activations share one device-local buffer at offsets from the memory plan, so a tensor's bytes are reused
once its last reader has run (texture activations: one memory block under their images). Inputs come in through
persistent host-visible staging and outputs go back through host-cached readback buffers; with direct I/O the
kernels bind those host buffers themselves."""
from __future__ import annotations

import threading
from collections import namedtuple

import numpy as np

from ..errors import DeviceError, MinirtError, UnsupportedError
from ..planner.memory_plan import arena, assign_offsets, buffer_alignment
from .commands import color_range

_Req = namedtuple("_Req", "size memoryTypeBits")   # a memory requirement covering several resources

# Live Vulkan objects of all executors: +1 in Resources.own (and for each Kernels object), -1 as they are destroyed.
_live = 0
_live_lock = threading.Lock()


def live_objects() -> int:
    """Vulkan objects created by executors and not destroyed yet."""
    return _live


def count_live(n):
    global _live
    with _live_lock:
        _live += n


def _arena_usage(vk):
    return (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)


class SharedArena:
    """One activation buffer for the executors of several plans whose runs never overlap (entry points of one
    Program: its lock serialises their runs, and each run waits for its fence), as large as the largest of their
    arenas (memory_plan.arena), instead of one each. The buffer and its memory belong to this object (close() frees
    them, after the executors using them are closed)."""

    def __init__(self, dev, nbytes: int):
        self.res = Resources(dev, None)
        self.nbytes = int(nbytes)
        self.buffer, _, _ = self.res.buffer(self.nbytes, _arena_usage(dev.vk),
                                            dev.vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "shared activations")

    def close(self):
        errors = []
        self.res.destroy_all(errors)
        if errors:
            raise errors[0]


class Resources:
    """where: tensor name -> ("buffer", VkBuffer, offset, size) | ("image", VkImage, VkImageView, extents);
    ranges: root name -> (start, end) bytes in one address space for hazard tracking (the arena's offsets, then the
    images', then the directly bound host buffers'); inputs: name -> (staging VkBuffer, float32 view of its mapped
    memory, TensorSpec); outputs: name -> (readback VkBuffer, mapped view, TensorSpec, VkMappedMemoryRange to
    invalidate or None where coherent); direct: the names whose host buffers the kernels bind."""

    def __init__(self, dev, plan, direct_roles=()):
        self.dev, self.vk, self.d, self.plan = dev, dev.vk, dev.device, plan
        self.direct_roles = direct_roles    # graph roles (INPUT, OUTPUT) bound in host memory (buffer storage)
        self.trash = []           # (destroy function, handle), destroyed in reverse order
        self.maps = []            # mapped memories
        self.imported = []        # host memory imported into Vulkan: kept alive until its memory objects are freed
        self.where, self.ranges = {}, {}
        self.inputs, self.outputs, self.direct = {}, {}, set()
        self.params = None        # int32 view of the mapped parameter block (place_state)
        self.sampler = None
        self.arena, self.arena_bytes, self.image_bytes = None, 0, 0
        self.const_buf = None     # weights and constants in buffer storage (minirt/vk/upload.py)

    # -- making objects ---------------------------------------------------------------------
    def own(self, destroy, handle):
        self.trash.append((destroy, handle))
        count_live(1)
        return handle

    def alloc(self, req, flags, what, avoid=0):
        vk = self.vk
        mt = self.dev.memory_type(req.memoryTypeBits, flags, avoid)
        try:
            info = vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mt)
            mem = vk.vkAllocateMemory(self.d, info, None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as e:
            raise DeviceError(f"out of memory allocating {req.size / 2**20:.1f} MiB for {what} "
                              f"on '{self.dev.profile.name}' ({type(e).__name__})") from None
        return self.own(vk.vkFreeMemory, mem), mt

    def buffer(self, size, usage, flags, what, avoid=0):
        vk = self.vk
        buf = self.own(vk.vkDestroyBuffer, vk.vkCreateBuffer(self.d, vk.VkBufferCreateInfo(
            size=max(int(size), 16), usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None))
        req = vk.vkGetBufferMemoryRequirements(self.d, buf)
        mem, mt = self.alloc(req, flags, what, avoid)
        vk.vkBindBufferMemory(self.d, buf, mem, 0)
        return buf, mem, mt

    def map(self, mem, size):
        m = self.vk.vkMapMemory(self.d, mem, 0, int(size), 0)
        self.maps.append(mem)
        return m

    def unmap(self, mem):
        self.vk.vkUnmapMemory(self.d, mem)
        self.maps.remove(mem)

    def _format(self, dtype):
        vk = self.vk
        return vk.VK_FORMAT_R16G16B16A16_SFLOAT if dtype == "float16" else vk.VK_FORMAT_R32G32B32A32_SFLOAT

    def image(self, extents, dtype="float32"):
        vk = self.vk
        x, y, z = extents
        if min(x, y, z) < 1:    # a zero extent is invalid Vulkan usage (lavapipe crashes binding its memory)
            raise UnsupportedError(f"a texture of extents {[x, y, z]} (a tensor with a zero-size dim) cannot be "
                                   f"created; minirt runs empty tensors only in storage='buffer'")
        return self.own(vk.vkDestroyImage, vk.vkCreateImage(self.d, vk.VkImageCreateInfo(
            imageType=vk.VK_IMAGE_TYPE_3D, format=self._format(dtype),
            extent=vk.VkExtent3D(x, y, z), mipLevels=1, arrayLayers=1, samples=vk.VK_SAMPLE_COUNT_1_BIT,
            tiling=vk.VK_IMAGE_TILING_OPTIMAL,
            usage=(vk.VK_IMAGE_USAGE_STORAGE_BIT | vk.VK_IMAGE_USAGE_SAMPLED_BIT
                   | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT),
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE, initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED), None))

    def view(self, image, dtype="float32"):
        vk = self.vk
        return self.own(vk.vkDestroyImageView, vk.vkCreateImageView(self.d, vk.VkImageViewCreateInfo(
            image=image, viewType=vk.VK_IMAGE_VIEW_TYPE_3D, format=self._format(dtype),
            subresourceRange=color_range(vk)), None))

    def make_sampler(self):
        """The sampler of every texture a kernel reads (texel fetches: nearest, clamped)."""
        vk = self.vk
        clamp = vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE
        self.sampler = self.own(vk.vkDestroySampler, vk.vkCreateSampler(self.d, vk.VkSamplerCreateInfo(
            magFilter=vk.VK_FILTER_NEAREST, minFilter=vk.VK_FILTER_NEAREST,
            addressModeU=clamp, addressModeV=clamp, addressModeW=clamp), None))

    # -- placing tensors --------------------------------------------------------------------
    def is_direct(self, t):
        return t.role in self.direct_roles and not t.view_of and t.storage == "buffer"

    def place_activations(self, shared=None):
        """Buffer-storage activations share one arena buffer, texture ones one memory block for their images;
        offsets come from the memory plan, so tensors alive at different times share bytes. shared: a SharedArena
        to place the buffer activations in instead of a buffer of their own."""
        vk, plan = self.vk, self.plan
        roots = [t for t in plan.tensors.values() if t.name in plan.lifetimes and not t.view_of
                 and not self.is_direct(t)]
        align = buffer_alignment(self.dev.profile)
        bufs = [t for t in roots if t.storage == "buffer"]
        offsets, total = arena(plan, align)
        if shared is not None:
            if total > shared.nbytes:
                raise MinirtError(f"this plan's activations take {total} bytes; the shared arena holds {shared.nbytes}")
            self.arena = shared.buffer
        else:
            self.arena, _, _ = self.buffer(total, _arena_usage(vk), vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                           "activations")
        self.arena_bytes = total
        for t in bufs:
            self.where[t.name] = ("buffer", self.arena, offsets[t.name], t.nbytes)
            self.ranges[t.name] = (offsets[t.name], offsets[t.name] + t.nbytes)
        texs = [t for t in roots if t.storage == "texture"]
        placed, self.image_bytes = self.place_images(texs, lambda t: plan.lifetimes[t.name], "activation textures")
        base = -(-self.arena_bytes // 16) * 16   # hazard ranges of images sit after the arena's
        for name, (off, size) in placed.items():
            self.ranges[name] = (base + off, base + off + size)

    def place_images(self, tensors, span, what):
        """Images for `tensors`, bound into one device-local memory block at offsets from the memory plan
        (tensors whose spans overlap never share bytes). Sets where; returns ({name: (offset, size)}, total bytes)."""
        vk = self.vk
        images, items, bits = {}, [], ~0
        for t in tensors:
            img = self.image(t.texel_extents, t.dtype)
            req = vk.vkGetImageMemoryRequirements(self.d, img)
            images[t.name] = img
            items.append((t.name, req.size, req.alignment, *span(t)))
            bits &= req.memoryTypeBits
        offsets, total = assign_offsets(items, 16)
        if not tensors:
            return {}, 0
        mem, _ = self.alloc(_Req(total, bits), vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, what)
        for name, *_ in items:
            vk.vkBindImageMemory(self.d, images[name], mem, offsets[name])
            t = self.plan.tensors[name]
            self.where[name] = ("image", images[name], self.view(images[name], t.dtype), t.texel_extents)
        return {name: (offsets[name], size) for name, size, *_ in items}, total

    def place_host(self):
        """Persistent staging for inputs (host-visible) and readback for outputs (host-cached). With direct
        I/O these are the tensors themselves, bound to the kernels (hazard ranges after the arena's)."""
        vk = self.vk
        hv = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        storage = vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
        base = max((e for _, e in self.ranges.values()), default=0) + 16

        def direct(name, t, buf):
            nonlocal base
            self.direct.add(name)
            self.where[name] = ("buffer", buf, 0, t.nbytes)
            self.ranges[name] = (base, base + t.nbytes)
            base += t.nbytes + 16

        for name in self.plan.inputs:
            t = self.plan.tensors[name]
            d = self.is_direct(t)
            buf, mem, mt = self.buffer(t.nbytes, vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | (storage if d else 0),
                                       hv | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, f"input '{name}' staging")
            if d:
                direct(name, t, buf)
            dtype = np.int32 if t.dtype == "int32" else np.float32
            self.inputs[name] = (buf, np.frombuffer(self.map(mem, t.nbytes), dtype, t.nbytes // 4), t)
        for name in self.plan.outputs:
            t = self.plan.tensors[name]
            d = self.is_direct(t)
            buf, mem, mt = self.buffer(t.nbytes, vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT | (storage if d else 0),
                                       hv | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, f"output '{name}' readback")
            if d:
                direct(name, t, buf)
            coherent = self.dev.is_coherent(mt)
            self.outputs[name] = (buf, np.frombuffer(self.map(mem, t.nbytes), np.float32, t.nbytes // 4), t,
                                  None if coherent else vk.VkMappedMemoryRange(
                                      memory=mem, offset=0, size=vk.VK_WHOLE_SIZE & 0xFFFFFFFFFFFFFFFF))

    def place_state(self, state):
        """The plan's state tensors, in the StateBuffers `state` (shared with the other plans of a Program; hazard
        ranges after everything else's), and the run-time parameter block: a host-visible uniform buffer whose int32
        view (self.params) the executor writes before each submission."""
        from ..plan import PARAMS_TENSOR
        vk, plan = self.vk, self.plan
        self.params = None
        if plan.state:
            if state is None:
                raise MinirtError("this plan has state tensors: run it in a minirt.program.Program")
            base = max((e for _, e in self.ranges.values()), default=0) + 16
            for name, w in state.bind(plan).items():
                self.where[name] = w
                self.ranges[name] = (base, base + w[3])
                base += w[3] + 16
        if PARAMS_TENSOR in plan.tensors:
            t = plan.tensors[PARAMS_TENSOR]
            buf, mem, _ = self.buffer(t.nbytes, vk.VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT,
                                      vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                      "the parameter block")
            self.where[PARAMS_TENSOR] = ("buffer", buf, 0, t.nbytes)
            self.params = np.frombuffer(self.map(mem, t.nbytes), np.int32, t.nbytes // 4)
            self.params[:] = 0

    def place_views(self):
        """A view's resource is its root's, in buffers from the root's offset + the view's byte offset (hazards and
        lifetimes stay those of the root, so the barriers are conservative)."""
        plan = self.plan
        for t in plan.tensors.values():
            if not t.view_of:
                continue
            w = self.where[plan.root(t.name)]
            off = plan.byte_offset(t.name)
            if off:
                align = self.dev.profile.min_storage_buffer_offset_alignment
                if w[0] != "buffer" or off % align or off + t.nbytes > w[3]:
                    raise MinirtError(f"view '{t.name}' at byte offset {off} of '{plan.root(t.name)}' cannot be "
                                      f"bound (needs a buffer, a multiple of {align} bytes, inside the root)")
                w = ("buffer", w[1], w[2] + off, w[3] - off)
            self.where[t.name] = w

    # -- teardown (the executor waits for the queue first) ----------------------------------
    def unmap_all(self, errors):
        """Unmap every mapped memory; failures are appended to `errors`. The numpy views of the mapped memory are
        dropped first, so nothing can touch it afterwards."""
        self.inputs, self.outputs, self.params = None, None, None
        for mem in self.maps:
            try:
                self.vk.vkUnmapMemory(self.d, mem)
            except Exception as e:
                errors.append(e)
        self.maps = []

    def destroy_all(self, errors):
        """Destroy every owned object, newest first, even when one destroy fails (appended to `errors`)."""
        trash, self.trash = self.trash, []
        for destroy, h in reversed(trash):
            try:
                destroy(self.d, h, None)
            except Exception as e:
                errors.append(e)
            count_live(-1)
        self.imported = []     # host memory goes only after the memory objects importing it
