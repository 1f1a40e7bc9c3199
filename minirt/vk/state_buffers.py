"""State tensors on the device (Plan.state): one device-local buffer each, made zero-filled the first time a Plan
names it, and shared by name with every other Executor given the same StateBuffers (the Plans of one Program,
minirt/program.py). They are never aliased, never staged and never read back: what one run writes, the next run (of
any of the Plans) reads."""
from __future__ import annotations

from ..errors import MinirtError
from .resources import Resources
from .upload import submit_wait


class StateBuffers:
    """name -> (VkBuffer, TensorSpec) of the state tensors made so far; the buffers and their memory belong to this
    object (close() frees them, after the executors using them are closed)."""

    def __init__(self, dev, timeout_s=600.0):
        self.dev = dev
        self.res = Resources(dev, None)      # owns the buffers (its plan is unused)
        self.timeout_ns = int(float(timeout_s) * 1e9)
        self.buffers = {}

    def bind(self, plan) -> dict:
        """{name: ("buffer", VkBuffer, 0, bytes)} for plan.state, making the buffers not made yet; a name already made
        must have the same shape and dtype."""
        vk, out, new = self.dev.vk, {}, []
        for name in plan.state:
            t = plan.tensors[name]
            have = self.buffers.get(name)
            if have is not None:
                if (have[1].shape, have[1].dtype) != (t.shape, t.dtype):
                    raise MinirtError(f"state tensor '{name}' is {list(t.shape)} {t.dtype} in this plan but "
                                      f"{list(have[1].shape)} {have[1].dtype} in another of the program")
            else:
                usage = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
                         | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT)
                buf, _, _ = self.res.buffer(t.nbytes, usage, vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
                                            f"state tensor '{name}'")
                self.buffers[name] = have = (buf, t)
                new.append(have)
            out[name] = ("buffer", have[0], 0, t.nbytes)
        if new:
            self._zero(new)
        return out

    def _zero(self, items):
        vk, d, res = self.dev.vk, self.dev.device, self.res
        pool = res.own(vk.vkDestroyCommandPool, vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=self.dev.family), None))
        cmd = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
            commandPool=pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        fence = res.own(vk.vkDestroyFence, vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None))
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        for buf, t in items:
            vk.vkCmdFillBuffer(cmd, buf, 0, max(t.nbytes, 16) // 4 * 4, 0)
        vk.vkEndCommandBuffer(cmd)
        with self.dev.lock:
            submit_wait(self.dev, cmd, fence, self.timeout_ns)

    def close(self):
        errors = []
        self.res.destroy_all(errors)
        self.buffers = {}
        if errors:
            raise errors[0]
