"""Weights and constants: laid out end to end in one device-local buffer (images, for textures) and uploaded once,
through a staging buffer of at most UPLOAD_CHUNK bytes."""
from __future__ import annotations

import numpy as np

from ..errors import DeviceError, MinirtError
from ..layout import to_texels
from ..plan import CONSTANT, WEIGHT, as_dtype
from ..planner.memory_plan import UPLOAD_CHUNK, buffer_alignment
from .commands import image_barrier, region

TIMEOUT_HINT = "the Session option timeout_s (or MINIRT_TIMEOUT_S) raises the limit"


class SharedConstants:
    """Weights and constants in buffer storage that the Executors of one Program (minirt/program.py) share: a
    constant that another plan of the program placed already, with the same name, dtype, shape and bytes, is bound
    where it is instead of uploaded again (a Whisper decoder's step plans for 1 row and for 5 hold the same
    weights). The buffers belong to this object: close() frees them, after the executors that use them."""

    def __init__(self, dev):
        from .resources import Resources
        self.res = Resources(dev, None)
        self.placed = {}      # (name, dtype, shape) -> [(host data, where)]

    def find(self, t):
        for data, where in self.placed.get((t.name, t.dtype, tuple(t.shape)), ()):
            if data is t.data or np.array_equal(data, t.data):
                return where
        return None

    def add(self, t, where):
        self.placed.setdefault((t.name, t.dtype, tuple(t.shape)), []).append((t.data, where))

    def close(self):
        errors = []
        self.res.destroy_all(errors)
        self.placed = {}
        if errors:
            raise errors[0]


def place_constants(res, timeout_ns, shared: SharedConstants | None = None):
    """Places every weight and constant of res.plan (sets res.where and res.const_buf) and uploads its data; with
    `shared`, buffer constants it holds already are bound there and the others are placed in it."""
    vk = res.vk
    consts = [t for t in res.plan.tensors.values() if t.role in (WEIGHT, CONSTANT) and not t.view_of]
    align = buffer_alignment(res.dev.profile)
    buf_items = [t for t in consts if t.storage == "buffer"]
    img_items = [t for t in consts if t.storage == "texture"]
    if shared is not None:
        for t in buf_items:
            found = shared.find(t)
            if found is not None:
                res.where[t.name] = found
        buf_items = [t for t in buf_items if t.name not in res.where]
    off, offsets = 0, {}
    for t in buf_items:
        offsets[t.name] = off
        off += -(-t.nbytes // align) * align
    uploads = []     # (bytes-like array, dst kind, dst, offset/extents)
    if buf_items:
        usage = vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        owner = res if shared is None else shared.res
        buf, _, _ = owner.buffer(off, usage, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "weights")
        if shared is None:
            res.const_buf = buf
        for t in buf_items:
            res.where[t.name] = ("buffer", buf, offsets[t.name], t.nbytes)
            if shared is not None:
                shared.add(t, res.where[t.name])
            uploads.append((as_dtype(t.data, t.dtype).reshape(-1), "buffer", buf, offsets[t.name]))
    # constants are all alive at once (span (0, 0)): laid end to end
    res.place_images(img_items, lambda t: (0, 0), "constant textures")
    for t in img_items:
        uploads.append((as_dtype(to_texels(t.data, t.packed_dim), t.dtype).reshape(-1), "image", res.where[t.name][1],
                        t.texel_extents))
    if uploads:
        _upload(res, uploads, timeout_ns)


def _upload(res, uploads, timeout_ns):
    vk, dev, d = res.vk, res.dev, res.d
    size = min(UPLOAD_CHUNK, max(u[0].nbytes for u in uploads))
    size = max(size, 16)
    staging, smem, _ = res.buffer(size, vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT,
                                  vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                  "upload staging")
    mapped = res.map(smem, size)
    view = np.frombuffer(mapped, np.uint8, size)
    pool = res.own(vk.vkDestroyCommandPool, vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(
        flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,   # cmd is begun again for each chunk
        queueFamilyIndex=dev.family), None))
    cmd = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
        commandPool=pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
    fence = res.own(vk.vkDestroyFence, vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None))

    def submit(fn):
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        fn()
        vk.vkEndCommandBuffer(cmd)
        with dev.lock:     # the queue is shared with other Sessions' runs (Vulkan: externally synchronised)
            submit_wait(dev, cmd, fence, timeout_ns)

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
                image_barrier(vk, cmd, [dst], vk.VK_IMAGE_LAYOUT_UNDEFINED, 0, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                              vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
                vk.vkCmdCopyBufferToImage(cmd, staging, dst, vk.VK_IMAGE_LAYOUT_GENERAL, 1, [region(vk, where)])
                image_barrier(vk, cmd, [dst], vk.VK_IMAGE_LAYOUT_GENERAL, vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                              vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_SHADER_READ_BIT,
                              vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT)
            submit(copy_img)
    del view
    res.unmap(smem)


def submit_wait(dev, cmd, fence, timeout_ns):
    """Submit `cmd` and wait for it (the caller holds dev.lock)."""
    vk = dev.vk
    info = vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])
    try:
        vk.vkQueueSubmit(dev.queue, 1, [info], fence)
        vk.vkWaitForFences(dev.device, 1, [fence], vk.VK_TRUE, timeout_ns)
    except vk.VkTimeout:
        # the work is still pending: its fence may not be reset, and close() waits for the queue
        # before it destroys anything the work uses
        raise DeviceError(f"the GPU did not finish within {timeout_ns / 1e9:g} s ({TIMEOUT_HINT})") from None
    except vk.VkError as e:
        raise DeviceError(f"the GPU failed while running: {type(e).__name__}") from None
    vk.vkResetFences(dev.device, 1, [fence])
