"""SPIR-V kernels: shader modules from spirv/, descriptor layouts, and pipelines keyed by
(variant, descriptor types, local size, specialization constants), each created once, through the
on-disk pipeline cache (minirt/vk/pipeline_cache.py), which is written back when the Kernels are destroyed."""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from ..errors import DeviceError, MinirtError
from .pipeline_cache import PipelineCache

SPIRV_DIRS = (Path(__file__).resolve().parents[2] / "spirv", Path(__file__).resolve().parents[1] / "spirv")


def spirv_dir() -> Path:
    for d in SPIRV_DIRS:
        if (d / "manifest.json").exists():
            return d
    raise MinirtError(f"no compiled kernels found (looked for manifest.json in {', '.join(map(str, SPIRV_DIRS))}); "
                      f"run `python tools/build_shaders.py`")


def _hint(kernel: str) -> str:
    """What turns a kernel's route off, for the kernels that depend on a recent driver extension."""
    if kernel.startswith("linear_cm2"):
        return "; option coopmat2=False plans the VK_KHR_cooperative_matrix GEMMs instead"
    return ""


class Kernels:
    def __init__(self, dev):
        self.dev, self.vk = dev, dev.vk
        self.dir = spirv_dir()
        self.manifest = json.loads((self.dir / "manifest.json").read_text())["shaders"]
        self.modules, self.set_layouts, self.pipe_layouts, self.pipelines = {}, {}, {}, {}
        self.created = 0          # pipelines this instance created (cache hits included)
        self.pipeline_s = 0.0     # seconds in vkCreateShaderModule + vkCreateComputePipelines
        self.cache = PipelineCache(dev)

    def module(self, name):
        if name not in self.modules:
            if name not in self.manifest:
                raise MinirtError(f"kernel '{name}' is not in {self.dir}/manifest.json; rebuild the shaders")
            code = (self.dir / f"{name}.spv").read_bytes()
            t0 = time.perf_counter()
            info = self.vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code)
            try:
                self.modules[name] = self.vk.vkCreateShaderModule(self.dev.device, info, None)
            except self.vk.VkError as e:
                raise DeviceError(f"the driver refused kernel '{name}' ({type(e).__name__}){_hint(name)}") from None
            self.pipeline_s += time.perf_counter() - t0
        return self.modules[name]

    def layout(self, types: tuple):
        """(descriptor set layout, pipeline layout) for bindings 0..n-1 of the given descriptor types."""
        if types not in self.pipe_layouts:
            vk = self.vk
            binds = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=t, descriptorCount=1,
                                                     stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                     for i, t in enumerate(types)]
            sl = vk.vkCreateDescriptorSetLayout(
                self.dev.device, vk.VkDescriptorSetLayoutCreateInfo(bindingCount=len(binds), pBindings=binds), None)
            rng = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=128)
            pl = vk.vkCreatePipelineLayout(self.dev.device, vk.VkPipelineLayoutCreateInfo(
                setLayoutCount=1, pSetLayouts=[sl], pushConstantRangeCount=1, pPushConstantRanges=[rng]), None)
            self.set_layouts[types], self.pipe_layouts[types] = sl, pl
        return self.set_layouts[types], self.pipe_layouts[types]

    def pipeline(self, name, types, local, spec):
        key = (name, types, tuple(local), tuple(spec))
        if key not in self.pipelines:
            vk = self.vk
            _, pl = self.layout(types)
            consts = list(local) + list(spec)   # ids 0-2: local size; 3..: the kernel's own
            data = struct.pack(f"<{len(consts)}i", *consts)
            entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4) for i in range(len(consts))]
            cdata = vk.ffi.new("char[]", data)
            sinfo = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries,
                                            dataSize=len(data), pData=cdata)
            stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                                       module=self.module(name), pName="main",
                                                       pSpecializationInfo=sinfo)
            flags = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR if self.dev.executable_statistics else 0
            info = vk.VkComputePipelineCreateInfo(flags=flags, stage=stage, layout=pl)
            t0 = time.perf_counter()
            try:
                self.pipelines[key] = vk.vkCreateComputePipelines(self.dev.device, self.cache.handle, 1, [info],
                                                                  None)[0]
            except vk.VkError as e:
                raise DeviceError(f"creating the pipeline of kernel '{name}' (local size {tuple(local)}, "
                                  f"specialization constants {tuple(spec)}) failed: {type(e).__name__}"
                                  f"{_hint(name)}") from None
            self.pipeline_s += time.perf_counter() - t0
            self.created += 1
        return self.pipelines[key], self.pipe_layouts[types]

    def statistics(self, pipeline) -> dict:
        """{name: value} the driver reports for a pipeline (VK_KHR_pipeline_executable_properties), or {} where the
        device was created without MINIRT_PIPELINE_STATS=1 or the driver has none."""
        fn = self.dev.executable_statistics
        if not fn:
            return {}
        vk, ffi = self.vk, self.vk.ffi
        info = ffi.new("VkPipelineExecutableInfoKHR*", {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                                                         "pipeline": pipeline, "executableIndex": 0})
        n = ffi.new("uint32_t*")
        if fn(self.dev.device, info, n, ffi.NULL) != vk.VK_SUCCESS or not n[0]:
            return {}
        stats = ffi.new("VkPipelineExecutableStatisticKHR[]", n[0])
        for i in range(n[0]):    # the raw call: every element needs its sType
            stats[i].sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
        if fn(self.dev.device, info, n, stats) not in (vk.VK_SUCCESS, vk.VK_INCOMPLETE):
            return {}
        out = {}
        for st in stats[0:n[0]]:
            fmt, v = st.format, st.value
            out[ffi.string(st.name).decode()] = (
                bool(v.b32) if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR else
                int(v.i64) if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR else
                int(v.u64) if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR else float(v.f64))
        return out

    def destroy(self):
        vk, d = self.vk, self.dev.device
        if self.created:
            try:
                self.cache.save()
            except Exception:       # a cache that cannot be written must not break closing
                pass
        self.cache.destroy()
        self.created = 0
        for p in self.pipelines.values():
            vk.vkDestroyPipeline(d, p, None)
        for p in self.pipe_layouts.values():
            vk.vkDestroyPipelineLayout(d, p, None)
        for s in self.set_layouts.values():
            vk.vkDestroyDescriptorSetLayout(d, s, None)
        for m in self.modules.values():
            vk.vkDestroyShaderModule(d, m, None)
        self.pipelines, self.pipe_layouts, self.set_layouts, self.modules = {}, {}, {}, {}
