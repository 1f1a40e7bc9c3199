"""Turns a Plan into Vulkan resources and one recorded command buffer, then replays it.

Activations share one device-local allocation (offsets from the memory plan, so a tensor's
memory is reused once its last reader has run); weights and constants are uploaded once into
their own buffer; inputs come in through persistent host-visible staging and outputs go back
through host-cached readback buffers."""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import namedtuple

import numpy as np

from ..errors import DeviceError, MinirtError, UnsupportedError
from ..layout import from_texels, to_texels
from ..planner.memory_plan import assign_offsets
from ..planner.plan import CONSTANT, INPUT, OUTPUT, WEIGHT, as_dtype
from ..timing import Phases
from .kernels import Kernels

UPLOAD_CHUNK = 64 << 20
ZERO_COPY_SLOTS = 3     # output sets a caller may hold while runs still return without a copy
ZERO_COPY_MAX_BYTES = 64 << 20   # above this (all outputs together), one slot
_Req = namedtuple("_Req", "size memoryTypeBits")   # a memory requirement covering several resources
QUERIES_PER_POOL = 4096

# Live Vulkan objects of all executors (buffers, memories, images, views, samplers, pools, fences,
# query pools, and each executor's pipelines, pipeline and set layouts and shader modules):
# +1 in _own, -1 in close. Tests check that it returns to its start (no leak).
_live = 0
_live_lock = threading.Lock()


def live_objects() -> int:
    """Vulkan objects created by executors and not destroyed yet."""
    return _live


def _count_live(n):
    global _live
    with _live_lock:
        _live += n


def _kernel_objects(k) -> int:
    cache = getattr(getattr(k, "cache", None), "handle", None)      # the VkPipelineCache, when there is one
    return (sum(len(getattr(k, a, ())) for a in ("pipelines", "pipe_layouts", "set_layouts", "modules"))
            + (cache is not None))


class Executor:
    def __init__(self, dev, plan, profile=False, progress=None):
        self.dev, self.vk, self.plan = dev, dev.vk, plan
        self.startup_ms = {}      # phase -> ms (alloc, upload, pipelines, record): Session.startup_ms
        phase = Phases(self.startup_ms, progress)
        self.profiling = bool(profile) and dev.profile.timestamp_valid_bits > 0
        # profile="span": one stamp before the first dispatch and one after the last, nothing between them, so the
        # run's GPU time is measured without whatever per-dispatch stamps cost
        self.span = profile == "span"
        self.d = dev.device
        self._trash = []          # (destroy function, handle), destroyed in reverse order
        self.slots = []           # zero-copy output slots (see _alloc_slots)
        self._imported = []       # host memory imported into Vulkan: kept alive until its memory objects are freed
        self._maps = []           # mapped memories
        self.timeout_ns = int(float(os.environ.get("MINIRT_TIMEOUT_S", "600")) * 1e9)
        # Poll the fence for up to this long before a blocking wait: a sleeping wait adds a thread wake-up
        # to every run (0.25 ms on an H200). Discrete GPUs only by default (phones would spend power on it);
        # MINIRT_SPIN_MS overrides, 0 turns it off.
        spin_ms = os.environ.get("MINIRT_SPIN_MS") or ("20" if dev.profile.device_type == "discrete" else "0")
        self.spin_s = float(spin_ms) / 1e3
        try:
            phase("pipelines")                    # opening the on-disk pipeline cache
            self.kernels = Kernels(dev)
            phase("alloc", "allocating")
            self.texture = plan.storage == "texture"
            if self.texture:
                self.sampler = self._own(self.vk.vkDestroySampler, self.vk.vkCreateSampler(self.d, self.vk.VkSamplerCreateInfo(
                    magFilter=self.vk.VK_FILTER_NEAREST, minFilter=self.vk.VK_FILTER_NEAREST,
                    addressModeU=self.vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE,
                    addressModeV=self.vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE,
                    addressModeW=self.vk.VK_SAMPLER_ADDRESS_MODE_CLAMP_TO_EDGE), None))
            # Direct I/O (buffers only): graph inputs and/or outputs live in host memory that the kernels read and
            # write over the bus, instead of staging copies before and after the run.
            # MINIRT_DIRECT_IO=0 (default), 1 (both), in, out.
            direct = os.environ.get("MINIRT_DIRECT_IO", "0").strip().lower()
            roles = {"1": (INPUT, OUTPUT), "both": (INPUT, OUTPUT), "in": (INPUT,), "out": (OUTPUT,)}.get(direct, ())
            self.direct_roles = roles if plan.storage == "buffer" else ()
            self.direct_io = bool(self.direct_roles)
            self.where = {}       # tensor name -> ("buffer", VkBuffer, offset, size) | ("image", VkImage, VkImageView, extents)
            self.ranges = {}      # root name -> (start, end) in the activation memory, for hazards
            self._alloc_activations()
            phase("upload", "uploading weights")
            self._alloc_constants()
            phase("alloc")
            self._alloc_host()
            for t in self.plan.tensors.values():     # views share their root's resource
                if t.view_of:
                    self._where_view(t)
            self._alloc_slots()
            if self.profiling:
                self._make_query_pools()
            phase("record", "creating pipelines and recording")
            self._record()
            phase(None)
            self.startup_ms["pipelines"] += self.kernels.pipeline_s * 1e3   # spent inside _record
            self.startup_ms["record"] -= self.kernels.pipeline_s * 1e3
            # the Kernels' pipelines, layouts and modules count as live objects too (all made by now)
            self._kernel_objects = _kernel_objects(self.kernels)
            _count_live(self._kernel_objects)
        except BaseException as e:
            try:
                self.close()
            except Exception:
                pass        # the first error is the one to report
            if isinstance(e, self.vk.VkError):     # e.g. out of host or device memory creating a buffer
                raise DeviceError(f"creating the Vulkan resources of this model on '{dev.profile.name}' failed: "
                                  f"{type(e).__name__}") from e
            raise

    # -- helpers ----------------------------------------------------------------------------
    def _own(self, destroy, handle):
        self._trash.append((destroy, handle))
        _count_live(1)
        return handle

    def _alloc(self, req, flags, what, avoid=0):
        vk = self.vk
        mt = self.dev.memory_type(req.memoryTypeBits, flags, avoid)
        try:
            mem = vk.vkAllocateMemory(self.d, vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mt), None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as e:
            raise DeviceError(f"out of memory allocating {req.size / 2**20:.1f} MiB for {what} "
                              f"on '{self.dev.profile.name}' ({type(e).__name__})") from None
        return self._own(vk.vkFreeMemory, mem), mt

    def _buffer(self, size, usage, flags, what, avoid=0):
        vk = self.vk
        buf = self._own(vk.vkDestroyBuffer, vk.vkCreateBuffer(self.d, vk.VkBufferCreateInfo(
            size=max(int(size), 16), usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None))
        req = vk.vkGetBufferMemoryRequirements(self.d, buf)
        mem, mt = self._alloc(req, flags, what, avoid)
        vk.vkBindBufferMemory(self.d, buf, mem, 0)
        return buf, mem, mt

    def _map(self, mem, size):
        m = self.vk.vkMapMemory(self.d, mem, 0, int(size), 0)
        self._maps.append(mem)
        return m

    def _format(self, dtype):
        vk = self.vk
        return vk.VK_FORMAT_R16G16B16A16_SFLOAT if dtype == "float16" else vk.VK_FORMAT_R32G32B32A32_SFLOAT

    def _image(self, extents, dtype="float32"):
        vk = self.vk
        x, y, z = extents
        if min(x, y, z) < 1:    # a zero extent is invalid Vulkan usage (lavapipe crashes binding its memory)
            raise UnsupportedError(f"a texture of extents {[x, y, z]} (a tensor with a zero-size dim) cannot be "
                                   f"created; minirt runs empty tensors only in storage='buffer'")
        return self._own(vk.vkDestroyImage, vk.vkCreateImage(self.d, vk.VkImageCreateInfo(
            imageType=vk.VK_IMAGE_TYPE_3D, format=self._format(dtype),
            extent=vk.VkExtent3D(x, y, z), mipLevels=1, arrayLayers=1, samples=vk.VK_SAMPLE_COUNT_1_BIT,
            tiling=vk.VK_IMAGE_TILING_OPTIMAL,
            usage=(vk.VK_IMAGE_USAGE_STORAGE_BIT | vk.VK_IMAGE_USAGE_SAMPLED_BIT
                   | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT),
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE, initialLayout=vk.VK_IMAGE_LAYOUT_UNDEFINED), None))

    def _view(self, image, dtype="float32"):
        vk = self.vk
        return self._own(vk.vkDestroyImageView, vk.vkCreateImageView(self.d, vk.VkImageViewCreateInfo(
            image=image, viewType=vk.VK_IMAGE_VIEW_TYPE_3D, format=self._format(dtype),
            subresourceRange=self._range()), None))

    def _range(self):
        vk = self.vk
        return vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                          baseArrayLayer=0, layerCount=1)

    # -- memory -----------------------------------------------------------------------------
    def _roots(self, roles):
        return [t for t in self.plan.tensors.values() if t.role in roles and not t.view_of]

    def _alloc_activations(self):
        """Buffer-storage activations share one arena buffer, texture ones one memory block for their
        images; offsets come from the memory plan, so tensors alive at different times share bytes."""
        vk, plan = self.vk, self.plan
        roots = [t for t in plan.tensors.values() if t.name in plan.lifetimes and not t.view_of
                 and not (self.direct_io and self._is_direct(t))]
        align = max(self.dev.profile.min_storage_buffer_offset_alignment, 16)
        bufs = [t for t in roots if t.storage == "buffer"]
        items = [(t.name, t.nbytes, align, *plan.lifetimes[t.name]) for t in bufs]
        offsets, total = assign_offsets(items, align)
        usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
                 | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
        self.arena, _, _ = self._buffer(total, usage, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "activations")
        self.arena_bytes = total
        for t in bufs:
            self.where[t.name] = ("buffer", self.arena, offsets[t.name], t.nbytes)
            self.ranges[t.name] = (offsets[t.name], offsets[t.name] + t.nbytes)
        texs = [t for t in roots if t.storage == "texture"]
        placed, self.image_bytes = self._images(texs, lambda t: plan.lifetimes[t.name], "activation textures")
        base = -(-self.arena_bytes // 16) * 16   # hazard ranges of images sit after the arena's
        for name, (off, size) in placed.items():
            self.ranges[name] = (base + off, base + off + size)

    def _images(self, tensors, span, what):
        """Images for `tensors`, bound into one device-local memory block at offsets from the memory plan
        (tensors whose spans overlap never share bytes). Sets self.where; returns ({name: (offset, size)},
        total bytes)."""
        vk = self.vk
        images, items, bits = {}, [], ~0
        for t in tensors:
            img = self._image(t.texel_extents, t.dtype)
            req = vk.vkGetImageMemoryRequirements(self.d, img)
            images[t.name] = img
            items.append((t.name, req.size, req.alignment, *span(t)))
            bits &= req.memoryTypeBits
        offsets, total = assign_offsets(items, 16)
        if not tensors:
            return {}, 0
        mem, _ = self._alloc(_Req(total, bits), vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, what)
        for name, *_ in items:
            vk.vkBindImageMemory(self.d, images[name], mem, offsets[name])
            t = self.plan.tensors[name]
            self.where[name] = ("image", images[name], self._view(images[name], t.dtype), t.texel_extents)
        return {name: (offsets[name], size) for name, size, *_ in items}, total

    def _alloc_constants(self):
        """Weights (and constants) are uploaded once, through a bounded staging buffer."""
        vk = self.vk
        consts = self._roots((WEIGHT, CONSTANT))
        align = max(self.dev.profile.min_storage_buffer_offset_alignment, 16)
        buf_items = [t for t in consts if t.storage == "buffer"]
        img_items = [t for t in consts if t.storage == "texture"]
        off, offsets = 0, {}
        for t in buf_items:
            offsets[t.name] = off
            off += -(-t.nbytes // align) * align
        uploads = []     # (bytes-like array, dst kind, dst, offset/extents)
        if buf_items:
            usage = vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
            self.const_buf, _, _ = self._buffer(off, usage, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "weights")
            for t in buf_items:
                self.where[t.name] = ("buffer", self.const_buf, offsets[t.name], t.nbytes)
                uploads.append((as_dtype(t.data, t.dtype).reshape(-1), "buffer", self.const_buf, offsets[t.name]))
        # constants are all alive at once (span (0, 0)): laid end to end
        self._images(img_items, lambda t: (0, 0), "constant textures")
        for t in img_items:
            uploads.append((as_dtype(to_texels(t.data, t.packed_dim), t.dtype).reshape(-1), "image", self.where[t.name][1],
                            t.texel_extents))
        if uploads:
            self._upload(uploads)

    def _upload(self, uploads):
        vk = self.vk
        size = min(UPLOAD_CHUNK, max(u[0].nbytes for u in uploads))
        size = max(size, 16)
        staging, smem, _ = self._buffer(size, vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                        vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                        "upload staging")
        mapped = self._map(smem, size)
        view = np.frombuffer(mapped, np.uint8, size)
        pool = self._own(vk.vkDestroyCommandPool, vk.vkCreateCommandPool(self.d, vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,   # cmd is begun again for each chunk
            queueFamilyIndex=self.dev.family), None))
        cmd = vk.vkAllocateCommandBuffers(self.d, vk.VkCommandBufferAllocateInfo(
            commandPool=pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        fence = self._own(vk.vkDestroyFence, vk.vkCreateFence(self.d, vk.VkFenceCreateInfo(), None))

        def submit(fn):
            vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            fn()
            vk.vkEndCommandBuffer(cmd)
            with self.dev.lock:     # the queue is shared with other Sessions' runs (Vulkan: externally synchronised)
                self._submit_wait(cmd, fence)

        for data, kind, dst, where in uploads:
            raw = data.view(np.uint8)
            if kind == "buffer":
                for start in range(0, raw.size, size):
                    n = min(size, raw.size - start)
                    view[:n] = raw[start:start + n]
                    submit(lambda: vk.vkCmdCopyBuffer(cmd, staging, dst, 1, [vk.VkBufferCopy(0, where + start, n)]))
            else:
                if raw.size > size:
                    raise MinirtError(f"a constant texture of {raw.size} bytes exceeds the upload chunk")
                view[:raw.size] = raw

                def copy_img():
                    self._image_barrier(cmd, [dst], vk.VK_IMAGE_LAYOUT_UNDEFINED, 0, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                                        vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
                    vk.vkCmdCopyBufferToImage(cmd, staging, dst, vk.VK_IMAGE_LAYOUT_GENERAL, 1, [self._region(where)])
                    self._image_barrier(cmd, [dst], vk.VK_IMAGE_LAYOUT_GENERAL, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                        vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_SHADER_READ_BIT,
                                        vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT)
                submit(copy_img)
        del view
        vk.vkUnmapMemory(self.d, smem)
        self._maps.remove(smem)

    def _region(self, extents):
        vk = self.vk
        return vk.VkBufferImageCopy(bufferOffset=0, bufferRowLength=0, bufferImageHeight=0,
                                    imageSubresource=vk.VkImageSubresourceLayers(
                                        aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0, baseArrayLayer=0, layerCount=1),
                                    imageOffset=vk.VkOffset3D(0, 0, 0), imageExtent=vk.VkExtent3D(*extents))

    def _image_barrier(self, cmd, images, old, src_access, src_stage, dst_access, dst_stage):
        vk = self.vk
        bars = [vk.VkImageMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access, oldLayout=old,
                                        newLayout=vk.VK_IMAGE_LAYOUT_GENERAL,
                                        srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                        dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                        image=img, subresourceRange=self._range()) for img in images]
        vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 0, None, 0, None, len(bars), bars)

    def _where_view(self, t):
        """A view's resource: its root's, and in buffers from the root's offset + the view's byte offset
        (hazards and lifetimes stay those of the root, so the barriers are conservative)."""
        w = self.where[self.plan.root(t.name)]
        off = self.plan.byte_offset(t.name)
        if off:
            align = self.dev.profile.min_storage_buffer_offset_alignment
            if w[0] != "buffer" or off % align or off + t.nbytes > w[3]:
                raise MinirtError(f"view '{t.name}' at byte offset {off} of '{self.plan.root(t.name)}' cannot be "
                                  f"bound (needs a buffer, a multiple of {align} bytes, inside the root)")
            w = ("buffer", w[1], w[2] + off, w[3] - off)
        self.where[t.name] = w

    def _is_direct(self, t):
        return t.role in self.direct_roles and not t.view_of and t.storage == "buffer"

    def _alloc_host(self):
        """Persistent staging for inputs (host-visible) and readback for outputs (host-cached). With direct
        I/O these are the tensors themselves, bound to the kernels (hazard ranges after the arena's)."""
        vk = self.vk
        hv = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        storage = vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
        self.inputs, self.outputs, self.direct = {}, {}, set()
        base = max((e for _, e in self.ranges.values()), default=0) + 16

        def direct(name, t, buf):
            nonlocal base
            self.direct.add(name)
            self.where[name] = ("buffer", buf, 0, t.nbytes)
            self.ranges[name] = (base, base + t.nbytes)
            base += t.nbytes + 16

        for name in self.plan.inputs:
            t = self.plan.tensors[name]
            d = self.direct_io and self._is_direct(t)
            buf, mem, mt = self._buffer(t.nbytes, vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | (storage if d else 0),
                                        hv | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, f"input '{name}' staging")
            if d:
                direct(name, t, buf)
            self.inputs[name] = (buf, np.frombuffer(self._map(mem, t.nbytes), np.float32, t.nbytes // 4), t)
        for name in self.plan.outputs:
            t = self.plan.tensors[name]
            d = self.direct_io and self._is_direct(t)
            buf, mem, mt = self._buffer(t.nbytes, vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT | (storage if d else 0),
                                        hv | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, f"output '{name}' readback")
            if d:
                direct(name, t, buf)
            coherent = self.dev.is_coherent(mt)
            self.outputs[name] = (buf, np.frombuffer(self._map(mem, t.nbytes), np.float32, t.nbytes // 4), t,
                                  None if coherent else vk.VkMappedMemoryRange(memory=mem, offset=0, size=vk.VK_WHOLE_SIZE & 0xFFFFFFFFFFFFFFFF))

    def _alloc_slots(self):
        """Zero-copy outputs (buffer storage, VK_EXT_external_memory_host): ZERO_COPY_SLOTS sets of numpy arrays whose
        memory the GPU copies the outputs into, each with its own recorded command buffer. A run uses a set no
        caller still holds (CPython reference counts of the arrays and of the memory they view) and returns its
        arrays as they are: no host copy of the result. When every set is held, the run falls back to the
        readback buffers and a copy. MINIRT_ZERO_COPY=0 turns it off."""
        vk, dev = self.vk, self.dev
        align = getattr(dev, "host_import_alignment", 0)
        names = list(self.outputs)
        if (not align or dev.host_pointer_properties is None or self.plan.storage != "buffer" or not names
                or os.environ.get("MINIRT_ZERO_COPY", "1").strip() == "0"
                or any(n in self.direct or self.where[n][0] != "buffer" for n in names)):
            return
        total = sum(self.plan.tensors[n].nbytes for n in names)
        # big outputs get one slot: host memory for three copies of them is not worth a saved copy
        for _ in range(ZERO_COPY_SLOTS if total <= ZERO_COPY_MAX_BYTES else 1):
            out, items = {}, []
            for n in names:
                t = self.plan.tensors[n]
                size = max(-(-t.nbytes // align) * align, align)     # a zero-size buffer is invalid Vulkan
                raw = np.empty(size + align, np.uint8)
                self._imported.append(raw)
                off = (-raw.ctypes.data) % align
                arr = raw[off:off + t.nbytes].view(np.float32).reshape(t.shape)
                buf = self._import_host(raw.ctypes.data + off, size, vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT, f"output '{n}'")
                if buf is None:
                    return self._drop_slots()    # the driver refuses this import: outputs are copied instead
                out[n] = (buf, arr)
                items.append((n, arr, raw))
            self.slots.append({"out": out, "items": items})
            del arr, raw          # the baseline counts must not include this function's own names
        for slot in self.slots:
            slot["base"] = _refs(slot["items"])

    def _drop_slots(self):
        self.slots = []      # their buffers and memories are destroyed with everything else at close

    def _import_host(self, addr, size, usage, what):
        """A VkBuffer on `size` bytes of this process's memory at `addr` (both multiples of the device's import
        alignment; VK_EXT_external_memory_host), in a host-coherent memory type so that neither side needs a flush;
        None where the driver refuses. Destroyed at close; the memory must stay allocated until then."""
        vk, dev, ffi = self.vk, self.dev, self.vk.ffi
        handle = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
        ptr = ffi.cast("void *", addr)
        ext = ffi.new("VkExternalMemoryBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO, "handleTypes": handle})
        buf = self._own(vk.vkDestroyBuffer, vk.vkCreateBuffer(self.d, vk.VkBufferCreateInfo(
            pNext=ext, size=size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None))
        props = ffi.new("VkMemoryHostPointerPropertiesEXT*",
                        {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT})
        if dev.host_pointer_properties(self.d, handle, ptr, props) != vk.VK_SUCCESS:
            return None
        req = vk.vkGetBufferMemoryRequirements(self.d, buf)
        bits = props.memoryTypeBits & req.memoryTypeBits
        coherent = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        types = [i for i in range(dev.mem_props.memoryTypeCount)
                 if bits & (1 << i) and dev.mem_props.memoryTypes[i].propertyFlags & coherent]
        if not types or req.size > size:
            return None
        imp = ffi.new("VkImportMemoryHostPointerInfoEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT, "handleType": handle, "pHostPointer": ptr})
        try:
            mem = vk.vkAllocateMemory(self.d, vk.VkMemoryAllocateInfo(pNext=imp, allocationSize=size,
                                                                     memoryTypeIndex=types[0]), None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory) as e:
            raise DeviceError(f"out of memory importing {size / 2**20:.1f} MiB of host memory for {what} "
                              f"on '{dev.profile.name}' ({type(e).__name__})") from None
        except vk.VkError:
            return None
        self._own(vk.vkFreeMemory, mem)
        vk.vkBindBufferMemory(self.d, buf, mem, 0)
        return buf

    # -- recording ----------------------------------------------------------------------------
    def _descriptor_type(self, name, access):
        vk = self.vk
        if self.where[name][0] == "buffer":
            return vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
        return vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE if access == "w" else vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER

    def _record(self):
        vk, plan = self.vk, self.plan
        counts = {}
        for d in plan.dispatches:
            for name, a in d.args:
                t = self._descriptor_type(name, a)
                counts[t] = counts.get(t, 0) + 1
        if plan.dispatches:
            sizes = [vk.VkDescriptorPoolSize(type=t, descriptorCount=n) for t, n in counts.items()]
            self.desc_pool = self._own(vk.vkDestroyDescriptorPool, vk.vkCreateDescriptorPool(
                self.d, vk.VkDescriptorPoolCreateInfo(maxSets=len(plan.dispatches), poolSizeCount=len(sizes),
                                                      pPoolSizes=sizes), None))
        self.cmd_pool = self._own(vk.vkDestroyCommandPool, vk.vkCreateCommandPool(self.d, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.dev.family), None))
        # one command buffer per zero-copy output slot, and the last one copies into the readback buffers
        cmds = vk.vkAllocateCommandBuffers(self.d, vk.VkCommandBufferAllocateInfo(
            commandPool=self.cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=len(self.slots) + 1))
        cmds = [cmds[i] for i in range(len(self.slots) + 1)]
        self.fence = self._own(vk.vkDestroyFence, vk.vkCreateFence(self.d, vk.VkFenceCreateInfo(), None))

        # Descriptor sets and pipelines first: they must stay alive while the command buffer exists.
        bound = []
        for d in plan.dispatches:
            types = tuple(self._descriptor_type(n, a) for n, a in d.args)
            set_layout, _ = self.kernels.layout(types)
            pipe, pl = self.kernels.pipeline(d.kernel, types, d.local_size, d.spec)
            ds = vk.vkAllocateDescriptorSets(self.d, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.desc_pool, descriptorSetCount=1, pSetLayouts=[set_layout]))[0]
            writes, keep = [], []
            for i, (name, a) in enumerate(d.args):
                w = self.where[name]
                if w[0] == "buffer":
                    info = vk.VkDescriptorBufferInfo(buffer=w[1], offset=w[2], range=max(w[3], 4))
                    keep.append(info)
                    writes.append(vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=i, descriptorCount=1,
                                                          descriptorType=types[i], pBufferInfo=[info]))
                else:
                    info = vk.VkDescriptorImageInfo(sampler=self.sampler if a == "r" else None, imageView=w[2],
                                                    imageLayout=vk.VK_IMAGE_LAYOUT_GENERAL)
                    keep.append(info)
                    writes.append(vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=i, descriptorCount=1,
                                                          descriptorType=types[i], pImageInfo=[info]))
            vk.vkUpdateDescriptorSets(self.d, len(writes), writes, 0, None)
            bound.append((pipe, pl, ds))

        ffi = vk.ffi
        self._cmds, self._submits = [], []
        for i, cmd in enumerate(cmds):
            dests = ({n: self.outputs[n][0] for n in self.outputs} if i == len(self.slots)
                     else {n: b for n, (b, _) in self.slots[i]["out"].items()})
            self._record_cmd(cmd, bound, dests)
            # The replay path calls the raw C entry points with cdata built once here (each wrapper call
            # costs microseconds of Python); these objects must outlive every run.
            arr = ffi.new("VkCommandBuffer[1]", [cmd])
            self._cmds.append(arr)
            self._submits.append(ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                           "commandBufferCount": 1, "pCommandBuffers": arr}))
        self._submit = self._submits[-1]
        self._fences = ffi.new("VkFence[1]", [self.fence])
        self._pending = False      # a run timed out and its fence has not signalled yet

    def _record_cmd(self, cmd, bound, dests):
        """Records the whole run into cmd; dests: output name -> the buffer its result is copied to."""
        vk, plan = self.vk, self.plan
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=0))
        C, T = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        SR, SW = vk.VK_ACCESS_SHADER_READ_BIT, vk.VK_ACCESS_SHADER_WRITE_BIT
        TR, TW = vk.VK_ACCESS_TRANSFER_READ_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT
        if self.plan.poison:   # before the inputs arrive: in textures, poisoned images may alias them
            self._poison(cmd)
            self._memory_barrier(cmd, T, TW, T, TW)
        # inputs: staging -> device
        for name, (buf, _, t) in self.inputs.items():
            w = self.where[name]
            if name in self.direct:
                continue     # the kernels read it where the host wrote it (visible at submission)
            if w[0] == "buffer":
                vk.vkCmdCopyBuffer(cmd, buf, w[1], 1, [vk.VkBufferCopy(0, w[2], t.nbytes)])
            else:
                # after the poison clears (transfer) and any earlier reader (compute) of this memory
                self._image_barrier(cmd, [w[1]], vk.VK_IMAGE_LAYOUT_UNDEFINED, TW, T | C, TW, T)
                vk.vkCmdCopyBufferToImage(cmd, buf, w[1], vk.VK_IMAGE_LAYOUT_GENERAL, 1, [self._region(w[3])])
        if self.inputs or self.plan.poison:
            self._memory_barrier(cmd, T, TW, C, SR | SW)
        self.barriers = 0
        if self.profiling:
            for pool, n in self.query_pools:
                vk.vkCmdResetQueryPool(cmd, pool, 0, n)
            self._stamp(cmd, 0)
        written, read = [], []
        # (poisoned images were just cleared to GENERAL; a transition from UNDEFINED would discard the NaNs)
        fresh = set() if self.plan.poison else {n for n in self.ranges
                                                if self.where[n][0] == "image" and n not in self.inputs}
        for i, (d, (pipe, pl, ds)) in enumerate(zip(plan.dispatches, bound)):
            r = [self.ranges[plan.root(n)] for n in d.reads if plan.root(n) in self.ranges]
            wr = [self.ranges[plan.root(n)] for n in d.writes if plan.root(n) in self.ranges]
            hazard = (_overlap(r, written) or _overlap(wr, written) or _overlap(wr, read))
            new_imgs = [self.where[plan.root(n)][1] for n in d.writes if plan.root(n) in fresh]
            fresh -= {plan.root(n) for n in d.writes}
            if new_imgs:
                # Aliased memory leaves an image's contents undefined: its first write starts from UNDEFINED.
                self._image_barrier(cmd, new_imgs, vk.VK_IMAGE_LAYOUT_UNDEFINED, SR | SW, C, SR | SW, C)
            if hazard:
                self._memory_barrier(cmd, C, SW, C, SR | SW)
                self.barriers += 1
                written, read = [], []
            written += wr
            read += r
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pl, 0, 1, [ds], 0, None)
            if d.push:
                vk.vkCmdPushConstants(cmd, pl, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(d.push),
                                      vk.ffi.from_buffer(d.push))
            groups = [-(-g // l) for g, l in zip(d.global_size, d.local_size)]
            if min(groups) > 0:
                vk.vkCmdDispatch(cmd, *groups)
            if self.profiling and not self.span:
                self._stamp(cmd, i + 1)
        if self.profiling and self.span:
            self._stamp(cmd, 1)
        self._memory_barrier(cmd, C, SW, T | vk.VK_PIPELINE_STAGE_HOST_BIT, TR | vk.VK_ACCESS_HOST_READ_BIT)
        for name, (_, _, t, _) in self.outputs.items():
            w = self.where[name]
            if name in self.direct:
                continue
            if w[0] == "buffer":
                vk.vkCmdCopyBuffer(cmd, w[1], dests[name], 1, [vk.VkBufferCopy(w[2], 0, t.nbytes)])
            else:
                vk.vkCmdCopyImageToBuffer(cmd, w[1], vk.VK_IMAGE_LAYOUT_GENERAL, dests[name], 1, [self._region(w[3])])
        self._memory_barrier(cmd, T, TW, vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkEndCommandBuffer(cmd)

    def _poison(self, cmd):
        """Fill every activation except inputs with NaN before each run, so an element no kernel
        writes shows up in the output (a testing aid: Session(..., options={"poison": True}))."""
        vk = self.vk
        nan = 0x7FC07FC0    # a NaN as one float32 and as each of two float16s
        vk.vkCmdFillBuffer(cmd, self.arena, 0, max(self.arena_bytes, 16) // 4 * 4, nan)
        for name in self.direct & set(self.outputs):
            vk.vkCmdFillBuffer(cmd, self.where[name][1], 0, vk.VK_WHOLE_SIZE & 0xFFFFFFFFFFFFFFFF, nan)
        imgs = [self.where[n][1] for n in self.ranges if self.where[n][0] == "image"]
        if imgs:
            self._image_barrier(cmd, imgs, vk.VK_IMAGE_LAYOUT_UNDEFINED, 0, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                                vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
            color = vk.VkClearColorValue(float32=[float("nan")] * 4)
            T, TW = vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT
            for i, img in enumerate(imgs):
                if i:   # images may alias: order the clears
                    self._memory_barrier(cmd, T, TW, T, TW)
                vk.vkCmdClearColorImage(cmd, img, vk.VK_IMAGE_LAYOUT_GENERAL, color, 1, [self._range()])

    # -- profiling ----------------------------------------------------------------------------
    def _make_query_pools(self):
        """One timestamp before the first dispatch and one after each: dispatch i's time is the
        gap between stamps i and i+1, so the times add up to the whole run. Pools hold at most
        QUERIES_PER_POOL queries each, so any number of dispatches fits."""
        vk = self.vk
        n = 2 if self.span else len(self.plan.dispatches) + 1
        self.query_pools = []
        for start in range(0, n, QUERIES_PER_POOL):
            cnt = min(QUERIES_PER_POOL, n - start)
            pool = self._own(vk.vkDestroyQueryPool, vk.vkCreateQueryPool(self.d, vk.VkQueryPoolCreateInfo(
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=cnt), None))
            self.query_pools.append((pool, cnt))

    def _stamp(self, cmd, q):
        pool, _ = self.query_pools[q // QUERIES_PER_POOL]
        self.vk.vkCmdWriteTimestamp(cmd, self.vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, q % QUERIES_PER_POOL)

    def dispatch_times_ns(self):
        """GPU nanoseconds per dispatch of the last run, or None when the device gives no usable clock."""
        vk, ffi = self.vk, self.vk.ffi
        p = self.dev.profile
        if not p.timestamp_period or not p.timestamp_valid_bits:
            return None
        ticks = []
        for pool, cnt in self.query_pools:
            buf = ffi.new("uint64_t[]", cnt)
            vk.vkGetQueryPoolResults(self.d, pool, 0, cnt, cnt * 8, buf, 8,
                                     vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            ticks.extend(buf[0:cnt])
        mask = (1 << p.timestamp_valid_bits) - 1 if p.timestamp_valid_bits < 64 else (1 << 64) - 1
        # differences modulo the valid bits survive a counter wrap within the run
        return [((b - a) & mask) * p.timestamp_period for a, b in zip(ticks, ticks[1:])]

    def _memory_barrier(self, cmd, src_stage, src_access, dst_stage, dst_access):
        vk = self.vk
        mb = vk.VkMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access)
        vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)

    # -- running ------------------------------------------------------------------------------
    def _submit_wait(self, cmd, fence, info=None):
        vk = self.vk
        info = info or vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])
        try:
            vk.vkQueueSubmit(self.dev.queue, 1, [info], fence)
            vk.vkWaitForFences(self.d, 1, [fence], vk.VK_TRUE, self.timeout_ns)
        except vk.VkTimeout:
            # the work is still pending: its fence may not be reset, and close() waits for the queue
            # before it destroys anything the work uses
            raise DeviceError(f"the GPU did not finish within {self.timeout_ns / 1e9:g} s "
                              f"(MINIRT_TIMEOUT_S raises the limit)") from None
        except vk.VkError as e:
            raise DeviceError(f"the GPU failed while running: {type(e).__name__}") from None
        vk.vkResetFences(self.d, 1, [fence])

    def run(self, feeds: dict) -> dict:
        """feeds: {input name: float32 array of the planned shape}. Returns {output name: array}."""
        for name, (_, view, t) in self.inputs.items():
            x = feeds[name]
            if self.texture:
                view[:] = to_texels(x, t.packed_dim).reshape(-1)
            else:
                np.copyto(view, x.reshape(-1), casting="no")
        lib, vk = self.vk.lib, self.vk
        slot = next((i for i, sl in enumerate(self.slots) if _refs(sl["items"]) == sl["base"]), None)
        submit = self._submit if slot is None else self._submits[slot]
        with self.dev.lock:
            rc = vk.VK_SUCCESS
            if self._pending:
                # the last run timed out: its command buffer may still execute; it must finish before
                # the fence is reset and the buffer resubmitted
                rc = lib.vkWaitForFences(self.d, 1, self._fences, 1, self.timeout_ns)
                if rc == vk.VK_SUCCESS:
                    lib.vkResetFences(self.d, 1, self._fences)
                    self._pending = False
            if rc == vk.VK_SUCCESS:
                rc = lib.vkQueueSubmit(self.dev.queue, 1, submit, self.fence)
                if rc == vk.VK_SUCCESS and self.spin_s:
                    # poll first: a sleeping wait costs a thread wake-up after the GPU is done
                    end = time.perf_counter() + self.spin_s
                    while lib.vkGetFenceStatus(self.d, self.fence) == vk.VK_NOT_READY and time.perf_counter() < end:
                        pass
                if rc == vk.VK_SUCCESS:
                    rc = lib.vkWaitForFences(self.d, 1, self._fences, 1, self.timeout_ns)
                    if rc == vk.VK_TIMEOUT:
                        self._pending = True
                    else:
                        lib.vkResetFences(self.d, 1, self._fences)
        if rc != vk.VK_SUCCESS:
            if rc == vk.VK_TIMEOUT:
                raise DeviceError(f"the GPU did not finish within {self.timeout_ns / 1e9:.0f} s "
                                  f"(MINIRT_TIMEOUT_S raises the limit; the next run waits for this one)")
            what = vk.exception_codes[rc].__name__ if rc in vk.exception_codes else f"VkResult {rc}"
            raise DeviceError(f"the GPU failed while running: {what}")
        if slot is not None:     # the GPU wrote these arrays; nobody else holds them
            return {name: arr for name, arr, _ in self.slots[slot]["items"]}
        out = {}
        for name, (_, view, t, rng) in self.outputs.items():
            if rng is not None:
                self.vk.vkInvalidateMappedMemoryRanges(self.d, 1, [rng])
            if self.texture:
                out[name] = from_texels(view, t.shape, t.packed_dim)
            else:
                out[name] = view.reshape(t.shape).copy()
        return out

    def close(self):
        """Destroy everything this executor created; idempotent, and safe after a failed __init__.
        Every object is destroyed even when one destroy fails; the first failure is raised after."""
        vk = self.vk
        if getattr(self, "inputs", None) is not None:
            self.inputs, self.outputs = None, None     # drop numpy views before unmapping
        errors = []
        if self._trash:
            # an upload or run that timed out may still be executing: nothing it uses may be destroyed before
            # it ends (other Sessions' work is never in flight here: they wait for it under the same lock)
            try:
                with self.dev.lock:
                    vk.vkQueueWaitIdle(self.dev.queue)
            except Exception as e:
                errors.append(e)
        for mem in self._maps:
            try:
                vk.vkUnmapMemory(self.d, mem)
            except Exception as e:
                errors.append(e)
        self._maps = []
        if hasattr(self, "kernels"):
            try:
                self.kernels.destroy()
            except Exception as e:
                errors.append(e)
            _count_live(-getattr(self, "_kernel_objects", 0))
            self._kernel_objects = 0
        trash, self._trash = self._trash, []
        for destroy, h in reversed(trash):
            try:
                destroy(self.d, h, None)
            except Exception as e:
                errors.append(e)
            _count_live(-1)
        self.slots, self._imported = [], []     # host memory goes only after the memory objects importing it
        if errors:
            raise DeviceError(f"closing the executor failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]


def _refs(items):
    """CPython reference counts of a slot's arrays and of the memory they view: a caller holding an output, or any
    view of it (numpy views reference the owner of the memory), raises one of them."""
    return [(sys.getrefcount(arr), sys.getrefcount(raw)) for _, arr, raw in items]


def _overlap(a, b):
    return any(s < e2 and s2 < e for s, e in a for s2, e2 in b)
