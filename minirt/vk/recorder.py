"""Recording a plan's run: descriptor sets, then one command buffer per destination of the outputs (each zero-copy
slot's, and the readback buffers'), each holding the whole run: input copies, the dispatches with a barrier wherever
one reads or writes bytes an earlier one since the last barrier wrote (or writes bytes one read), output copies.
Optionally NaN poison fills before the inputs arrive, and timestamp queries around the dispatches."""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from ..plan import PARAMS
from .commands import color_range, image_barrier, memory_barrier, region

QUERIES_PER_POOL = 4096
_recorded = 0     # command buffers recorded by every Recorder of the process


def recordings() -> int:
    """Command buffers recorded so far in this process (tests check that replaying a plan records none)."""
    return _recorded


def make_query_pools(res, n):
    """[(VkQueryPool, query count)] holding n timestamps, at most QUERIES_PER_POOL each, so that any number of
    dispatches fits."""
    vk, pools = res.vk, []
    for start in range(0, n, QUERIES_PER_POOL):
        cnt = min(QUERIES_PER_POOL, n - start)
        pool = res.own(vk.vkDestroyQueryPool, vk.vkCreateQueryPool(res.d, vk.VkQueryPoolCreateInfo(
            queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=cnt), None))
        pools.append((pool, cnt))
    return pools


class _Ranges:
    """A set of byte ranges [start, end) (start <= end) that answers whether a range overlaps any of them: whether
    each starts before the other ends. Ranges with bytes are kept merged where they share bytes (disjoint, sorted by
    start, so their ends are sorted too); empty ones, points that overlap a range they lie strictly inside, apart."""

    def __init__(self):
        self.starts, self.ends, self.points = [], [], []

    def add(self, start, end):
        if start == end:
            insort(self.points, start)
            return
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, start)            # ranges [i, j) share bytes with [start, end)
        j = bisect_left(starts, end)
        if i < j:
            start, end = min(start, starts[i]), max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]

    def overlaps(self, start, end):
        i = bisect_right(self.ends, start)       # the first range ending after start
        if i < len(self.ends) and self.starts[i] < end:
            return True
        i = bisect_right(self.points, start)     # the first point after start
        return i < len(self.points) and self.points[i] < end


def barrier_points(accesses):
    """accesses: per dispatch in order, (the byte ranges it reads, the byte ranges it writes). Returns the indices of
    the dispatches that need a barrier before them: those that read bytes a dispatch since the last barrier wrote, or
    write bytes one since then read or wrote. O(n log n) in the ranges (sets of merged ranges, not every earlier range
    compared with every later one: that took 12 s a command buffer for a Gather of 20,000 shuffled indices)."""
    points, written, read = [], _Ranges(), _Ranges()
    for i, (reads, writes) in enumerate(accesses):
        if (any(written.overlaps(s, e) for s, e in reads) or any(written.overlaps(s, e) for s, e in writes)
                or any(read.overlaps(s, e) for s, e in writes)):
            points.append(i)
            written, read = _Ranges(), _Ranges()
        for s, e in writes:
            written.add(s, e)
        for s, e in reads:
            read.add(s, e)
    return points


class Recorder:
    """query_pools: None (no timestamps), or pools for one stamp before the first dispatch and one after each, so
    that dispatch i's time is the gap between stamps i and i+1 (span: one after the last dispatch only)."""

    def __init__(self, res, kernels, query_pools=None, span=False):
        self.res, self.vk, self.plan, self.kernels = res, res.vk, res.plan, kernels
        self.query_pools, self.span = query_pools, span
        self.desc_pool = None
        self.barriers = 0         # between dispatches, in each command buffer

    def _descriptor_type(self, name, access):
        vk = self.vk
        if self.plan.tensors[name].role == PARAMS:
            return vk.VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
        if self.res.where[name][0] == "buffer":
            return vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
        return vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE if access == "w" else vk.VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER

    def record(self, slots):
        """(fence, command buffer arrays, VkSubmitInfo pointers): one per slot, then the readback one. The replay
        path calls the raw C entry points with cdata built once here (each wrapper call costs microseconds of
        Python); these objects must outlive every run."""
        vk, plan, res, d = self.vk, self.plan, self.res, self.res.d
        counts = {}
        for disp in plan.dispatches:
            for name, a in disp.args:
                t = self._descriptor_type(name, a)
                counts[t] = counts.get(t, 0) + 1
        if plan.dispatches:
            sizes = [vk.VkDescriptorPoolSize(type=t, descriptorCount=n) for t, n in counts.items()]
            self.desc_pool = res.own(vk.vkDestroyDescriptorPool, vk.vkCreateDescriptorPool(
                d, vk.VkDescriptorPoolCreateInfo(maxSets=len(plan.dispatches), poolSizeCount=len(sizes),
                                                 pPoolSizes=sizes), None))
        cmd_pool = res.own(vk.vkDestroyCommandPool, vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=res.dev.family), None))
        cmds = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
            commandPool=cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=len(slots) + 1))
        cmds = [cmds[i] for i in range(len(slots) + 1)]
        fence = res.own(vk.vkDestroyFence, vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None))
        bound = self._bind()
        ranges = res.ranges
        barriers = set(barrier_points(
            ([ranges[plan.root(n)] for n in d.reads if plan.root(n) in ranges],
             [ranges[plan.root(n)] for n in d.writes if plan.root(n) in ranges]) for d in plan.dispatches))
        ffi = vk.ffi
        arrays, submits = [], []
        for i, cmd in enumerate(cmds):
            dests = ({n: res.outputs[n][0] for n in res.outputs} if i == len(slots)
                     else {n: b for n, (b, _) in slots[i]["out"].items()})
            self._record_cmd(cmd, bound, dests, barriers)
            arr = ffi.new("VkCommandBuffer[1]", [cmd])
            arrays.append(arr)
            submits.append(ffi.new("VkSubmitInfo*", {"sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO,
                                                     "commandBufferCount": 1, "pCommandBuffers": arr}))
        return fence, arrays, submits

    def _bind(self):
        """[(pipeline, pipeline layout, descriptor set)] per dispatch. Made before recording: they must stay alive
        while the command buffers exist."""
        vk, res = self.vk, self.res
        bound = []
        for disp in self.plan.dispatches:
            types = tuple(self._descriptor_type(n, a) for n, a in disp.args)
            set_layout, _ = self.kernels.layout(types)
            pipe, pl = self.kernels.pipeline(disp.kernel, types, disp.local_size, disp.spec)
            ds = vk.vkAllocateDescriptorSets(res.d, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.desc_pool, descriptorSetCount=1, pSetLayouts=[set_layout]))[0]
            writes, keep = [], []
            for i, (name, a) in enumerate(disp.args):
                w = res.where[name]
                if w[0] == "buffer":
                    info = vk.VkDescriptorBufferInfo(buffer=w[1], offset=w[2], range=max(w[3], 4))
                    keep.append(info)
                    writes.append(vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=i, descriptorCount=1,
                                                          descriptorType=types[i], pBufferInfo=[info]))
                else:
                    info = vk.VkDescriptorImageInfo(sampler=res.sampler if a == "r" else None, imageView=w[2],
                                                    imageLayout=vk.VK_IMAGE_LAYOUT_GENERAL)
                    keep.append(info)
                    writes.append(vk.VkWriteDescriptorSet(dstSet=ds, dstBinding=i, descriptorCount=1,
                                                          descriptorType=types[i], pImageInfo=[info]))
            vk.vkUpdateDescriptorSets(res.d, len(writes), writes, 0, None)
            bound.append((pipe, pl, ds))
        return bound

    def _record_cmd(self, cmd, bound, dests, barriers):
        """Records the whole run into cmd; dests: output name -> the buffer its result is copied to; barriers: the
        indices of the dispatches that need a barrier before them (barrier_points)."""
        global _recorded
        vk, plan, res = self.vk, self.plan, self.res
        where, ranges = res.where, res.ranges
        profiling = self.query_pools is not None
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=0))
        _recorded += 1
        C, T = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        SR, SW = vk.VK_ACCESS_SHADER_READ_BIT, vk.VK_ACCESS_SHADER_WRITE_BIT
        TR, TW = vk.VK_ACCESS_TRANSFER_READ_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT
        if plan.state:     # state written by an earlier submission (of this plan or another) is read and written here
            memory_barrier(vk, cmd, C | T, SW | TW, C | T, SR | SW | TR | TW)
        if plan.poison:   # before the inputs arrive: in textures, poisoned images may alias them
            self._poison(cmd)
            memory_barrier(vk, cmd, T, TW, T, TW)
        # inputs: staging -> device
        for name, (buf, _, t) in res.inputs.items():
            w = where[name]
            if name in res.direct:
                continue     # the kernels read it where the host wrote it (visible at submission)
            if w[0] == "buffer":
                vk.vkCmdCopyBuffer(cmd, buf, w[1], 1, [vk.VkBufferCopy(0, w[2], t.nbytes)])
            else:
                # after the poison clears (transfer) and any earlier reader (compute) of this memory
                image_barrier(vk, cmd, [w[1]], vk.VK_IMAGE_LAYOUT_UNDEFINED, TW, T | C, TW, T)
                vk.vkCmdCopyBufferToImage(cmd, buf, w[1], vk.VK_IMAGE_LAYOUT_GENERAL, 1, [region(vk, w[3])])
        if res.inputs or plan.poison:
            memory_barrier(vk, cmd, T, TW, C, SR | SW)
        self.barriers = 0
        if profiling:
            for pool, n in self.query_pools:
                vk.vkCmdResetQueryPool(cmd, pool, 0, n)
            self._stamp(cmd, 0)
        # (poisoned images were just cleared to GENERAL; a transition from UNDEFINED would discard the NaNs)
        fresh = set() if plan.poison else {n for n in ranges if where[n][0] == "image" and n not in res.inputs}
        for i, (d, (pipe, pl, ds)) in enumerate(zip(plan.dispatches, bound)):
            new_imgs = [where[plan.root(n)][1] for n in d.writes if plan.root(n) in fresh]
            fresh -= {plan.root(n) for n in d.writes}
            if new_imgs:
                # Aliased memory leaves an image's contents undefined: its first write starts from UNDEFINED.
                image_barrier(vk, cmd, new_imgs, vk.VK_IMAGE_LAYOUT_UNDEFINED, SR | SW, C, SR | SW, C)
            if i in barriers:
                memory_barrier(vk, cmd, C, SW, C, SR | SW)
                self.barriers += 1
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe)
            vk.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pl, 0, 1, [ds], 0, None)
            if d.push:
                vk.vkCmdPushConstants(cmd, pl, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(d.push),
                                      vk.ffi.from_buffer(d.push))
            groups = [-(-g // l) for g, l in zip(d.global_size, d.local_size)]
            if min(groups) > 0:
                vk.vkCmdDispatch(cmd, *groups)
            if profiling and not self.span:
                self._stamp(cmd, i + 1)
        if profiling and self.span:
            self._stamp(cmd, 1)
        memory_barrier(vk, cmd, C, SW, T | vk.VK_PIPELINE_STAGE_HOST_BIT, TR | vk.VK_ACCESS_HOST_READ_BIT)
        for name, (_, _, t, _) in res.outputs.items():
            w = where[name]
            if name in res.direct:
                continue
            if w[0] == "buffer":
                vk.vkCmdCopyBuffer(cmd, w[1], dests[name], 1, [vk.VkBufferCopy(w[2], 0, t.nbytes)])
            else:
                vk.vkCmdCopyImageToBuffer(cmd, w[1], vk.VK_IMAGE_LAYOUT_GENERAL, dests[name], 1, [region(vk, w[3])])
        memory_barrier(vk, cmd, T, TW, vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkEndCommandBuffer(cmd)

    def _poison(self, cmd):
        """Fill every activation except inputs with NaN before each run, so an element no kernel
        writes shows up in the output (a testing aid: Session(..., options={"poison": True}))."""
        vk, res = self.vk, self.res
        nan = 0x7FC07FC0    # a NaN as one float32 and as each of two float16s
        vk.vkCmdFillBuffer(cmd, res.arena, 0, max(res.arena_bytes, 16) // 4 * 4, nan)
        for name in res.direct & set(res.outputs):
            vk.vkCmdFillBuffer(cmd, res.where[name][1], 0, vk.VK_WHOLE_SIZE & 0xFFFFFFFFFFFFFFFF, nan)
        imgs = [res.where[n][1] for n in res.ranges if res.where[n][0] == "image"]
        if imgs:
            image_barrier(vk, cmd, imgs, vk.VK_IMAGE_LAYOUT_UNDEFINED, 0, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                          vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT)
            color = vk.VkClearColorValue(float32=[float("nan")] * 4)
            T, TW = vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_ACCESS_TRANSFER_WRITE_BIT
            for i, img in enumerate(imgs):
                if i:   # images may alias: order the clears
                    memory_barrier(vk, cmd, T, TW, T, TW)
                vk.vkCmdClearColorImage(cmd, img, vk.VK_IMAGE_LAYOUT_GENERAL, color, 1, [color_range(vk)])

    def _stamp(self, cmd, q):
        pool, _ = self.query_pools[q // QUERIES_PER_POOL]
        self.vk.vkCmdWriteTimestamp(cmd, self.vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, q % QUERIES_PER_POOL)
