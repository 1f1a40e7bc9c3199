"""What the planner needs to know about a Vulkan device, as plain data.

The Vulkan side fills a DeviceProfile from the physical device; this module
must not import `vulkan`, so that pickers (see minirt/kernels/) can be tested on
the fake profiles in KNOWN_PROFILES without a GPU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

VENDORS = ("adreno", "mali", "powervr", "nvidia", "amd", "intel", "llvmpipe", "other")
DEVICE_TYPES = ("discrete", "integrated", "cpu", "virtual", "other")
MOBILE_VENDORS = ("adreno", "mali", "powervr")

# PCI / Khronos vendor IDs (VkPhysicalDeviceProperties.vendorID).
_VENDOR_IDS = {
    0x5143: "adreno",  # Qualcomm (also Mesa Turnip)
    0x13B5: "mali",  # ARM
    0x1010: "powervr",  # Imagination
    0x10DE: "nvidia",
    0x1002: "amd",
    0x8086: "intel",
}
_MESA_ID = 0x10005  # VK_VENDOR_ID_MESA: lavapipe reports itself as "llvmpipe (...)"

# Fallback on the device name, in order; word boundaries keep "amd"/"mali"
# from matching inside unrelated words.
_NAME_HINTS = (
    ("llvmpipe", re.compile(r"llvmpipe|lavapipe")),
    ("adreno", re.compile(r"adreno")),
    ("mali", re.compile(r"\bmali\b|immortalis")),
    ("powervr", re.compile(r"powervr")),
    ("nvidia", re.compile(r"nvidia")),
    ("amd", re.compile(r"radeon|\bamd\b")),
    ("intel", re.compile(r"\bintel\b")),
)


def format_uuid(raw: bytes) -> str:
    """16 bytes as a UUID's text ("" for all zeros: a driver that gives no UUID)."""
    h = bytes(raw).hex()
    if len(h) != 32 or not h.strip("0"):
        return ""
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def classify_vendor(vendor_id: int, name: str) -> str:
    """Map a vendorID and device name to one of VENDORS."""
    lname = (name or "").lower()
    if vendor_id in _VENDOR_IDS:
        return _VENDOR_IDS[vendor_id]
    if vendor_id == _MESA_ID and "llvmpipe" in lname:
        return "llvmpipe"
    for vendor, pattern in _NAME_HINTS:
        if pattern.search(lname):
            return vendor
    return "other"


@dataclass(frozen=True)
class DeviceProfile:
    name: str = "generic"
    vendor: str = "other"
    vendor_id: int = 0
    device_type: str = "discrete"
    api_version: str = "1.3.0"
    driver: str = ""
    max_invocations: int = 1024  # maxComputeWorkGroupInvocations
    max_local_size: tuple[int, int, int] = (1024, 1024, 64)  # maxComputeWorkGroupSize
    max_group_count: tuple[int, int, int] = (65535, 65535, 65535)
    subgroup_size: int = 32
    subgroup_shuffle: bool = False  # subgroupShuffle* in compute shaders
    max_shared_memory: int = 32768  # bytes
    max_push_constants: int = 128  # bytes
    max_image_3d: int = 2048
    max_storage_buffer_range: int = 1 << 27
    min_storage_buffer_offset_alignment: int = 256
    fp16: bool = False  # shaderFloat16
    storage16: bool = False  # storageBuffer16BitAccess
    storage8: bool = False  # storageBuffer8BitAccess (linear_cm2's int8 weights load as int8 matrices)
    cooperative_matrix: bool = False  # VK_KHR_cooperative_matrix usable (extension, feature, memory model)
    # subgroup-scope shapes it reports: (M, N, K, A type, B type, C type, result type), types "f16", "f32", ...
    coopmat_shapes: tuple = ()
    timestamp_period: float = 1.0  # ns per tick
    timestamp_valid_bits: int = 64
    # multiprocessors (NVIDIA SMs, AMD compute units) where the driver tells (VK_NV_shader_sm_builtins,
    # VK_AMD_shader_core_properties2), else 0: how many work groups fill one wave of the GPU
    compute_units: int = 0
    # VK_NV_cooperative_matrix2 where the device can run glsl/linear_cm2.comp (the extension, its workgroup-scope,
    # flexible-dimension, per-element and tensor-addressing features, Vulkan 1.3 for its SPIR-V 1.6, and
    # VK_KHR_cooperative_matrix): (M, N, K granularity, workgroup invocations) of each workgroup-scope f16 x f16 -> f32
    # flexible-dimension combination it reports; () elsewhere
    coopmat2: tuple = ()
    coopmat2_max_dimension: int = 0   # cooperativeMatrixFlexibleDimensionsMaxDimension: a matrix's largest side
    # why VK_NV_cooperative_matrix2 is listed but not usable ("" where it is usable or not listed): for plan notes
    coopmat2_missing: str = ""
    # where 16 x 16 cooperative matrices keep their elements, when minirt/vk/coopmat_probe.py matched one of
    # COOPMAT_LAYOUTS on the device ("" elsewhere): kernels that index accumulator elements need it
    coopmat_layout: str = ""
    # memory, as the driver reports it; 0 where not known (the fakes in KNOWN_PROFILES), and then not checked:
    device_heap: int = 0          # bytes of the heap that device-local memory (weights, activations) comes from
    host_heap: int = 0            # bytes of the heap that host-visible memory (input staging, output readback) comes from
    unified_heap: bool = False    # one heap holds both (CPUs, integrated GPUs): together they must fit it
    max_allocation: int = 0       # maxMemoryAllocationSize: no tensor may need more in one allocation
    # VkPhysicalDeviceIDProperties.deviceUUID as "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" ("" where the driver reports
    # zeros); on NVIDIA the GPU's UUID, the one NVML, nvidia-smi and CUDA_VISIBLE_DEVICES write "GPU-<uuid>"
    uuid: str = ""

    def __post_init__(self):
        # Catch typos in hand-written fakes early.
        if self.vendor not in VENDORS:
            raise ValueError(f"unknown vendor {self.vendor!r}; expected one of {VENDORS}")
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"unknown device_type {self.device_type!r}; expected one of {DEVICE_TYPES}")

    @cached_property
    def tuning(self) -> "Tuning":
        """What minirt's plans do differently on this device: TUNING's rows that match it, in order."""
        t = Tuning()
        for vendors, types, changes in TUNING:
            if (vendors is None or self.vendor in vendors) and (types is None or self.device_type in types):
                t = replace(t, **changes)
        return t

    def wave_slots(self, shared_bytes: int, most: int | None = None) -> int:
        """Work groups declaring `shared_bytes` of shared memory that run at once (one wave), or 0 where the
        multiprocessor count is unknown. A multiprocessor holds as many as its shared memory allows; NVIDIA's Vulkan
        driver gives it the same 48 KiB one group may declare (tools/dev/occupancy.py probe on an H200: 4 groups of 12 KiB,
        3 of 13-16, 2 of 17-24, 1 above), so the per-group limit stands in for it. `most`: a kernel's own cap per
        multiprocessor, where its registers allow fewer groups than its shared memory."""
        per_unit = max(1, self.max_shared_memory // max(1, shared_bytes))
        return self.compute_units * (min(per_unit, most) if most else per_unit)


@dataclass(frozen=True)
class Tuning:
    """Choices that depend on the kind of device, each measured where its row in TUNING says (docs/benchmarks.md,
    "Why the defaults are what they are"). The defaults hold for any device nothing below matches."""
    storage: str = "buffer"           # Session(storage="auto"): where activations live
    gemm_groups: str = "plain"        # GEMM work groups (minirt/kernels/gemm.py): "plain" 8x8, "adreno" fixed 16x4, "desktop"
                                      # (256-invocation groups, or WAVE_SHAPES where the multiprocessors are known)
    im2col_shape: tuple = (16, 4, 1)  # 2-D im2col work groups (ExecuTorch's shape)
    linear_tile: str = "t44"          # glsl/linear.comp tile: 16-deep slices fit any shared memory
    split_work: bool = False          # split GEMM K loops and attention keys to fill a wave (needs compute_units)
    spin_ms: float = 0.0              # poll a run's fence before a sleeping wait (costs power: not on phones)
    paired_lanes: bool = False        # PAIR_LANES in linear.comp and attention.glslh
    small_pass_invocations: int = 0   # work-group size of the row kernels and attention combine (0: the default 64)
    subgroup_rows: bool = False       # LayerNorm one subgroup a row (glsl/layer_norm_rows.comp: subgroup arithmetic)
    attention_cpu_tiles: bool = False  # the fp32 attention's CPU_TILES first
    attention_prefetch: bool = True   # the fp32 attention stages K and V through registers one phase ahead
    register_file: int = 65536        # 32-bit registers a multiprocessor: how many tensor-core attention groups fit
    # Linears of at most this many rows run on the few-row kernel (glsl/linear_rows.comp, which reads each weight once
    # for all its rows; up to 32, minirt/kernels/gemm.py ROWS_LIMIT) instead of the tiled or tensor-core GEMMs; option
    # rows_max forces it. 8 (a decoder step of a few beams) until a batched step's 16-32 rows are measured there
    rows_max: int = 8
    # linear_cm tile -> work groups a multiprocessor holds by its registers (116 and 185 a lane for the 64 x 64 and
    # 64 x 128 one-stage tiles on an H200, tools/dev/occupancy.py), where that is fewer than shared memory allows
    cm_register_groups: tuple = (("m64n64k32s1", 4), ("m64n128k32s1", 2), ("r64n64", 4))


# (vendors or None for any, device types or None for any, changes to Tuning): every row that matches applies, in order.
TUNING = (
    (MOBILE_VENDORS, None, dict(storage="texture")),                 # texture caches, fast sampled reads
    (("adreno",), None, dict(gemm_groups="adreno")),                  # 8x8 and 4x16 corrupt tiled-GEMM groups
    (("nvidia", "amd"), None, dict(gemm_groups="desktop", im2col_shape=(4, 16, 1))),
    (None, ("discrete",), dict(linear_tile="t44k32", split_work=True, spin_ms=20.0)),
    (None, ("cpu",), dict(attention_cpu_tiles=True, attention_prefetch=False)),   # no latency to hide
    (("nvidia",), None, dict(paired_lanes=True, small_pass_invocations=256)),
    (("nvidia", "amd", "intel", "llvmpipe"), None, dict(subgroup_rows=True)),
)


def _mma_layout(lane: int, i: int) -> tuple[int, int]:
    """NVIDIA's mma.m16n8k16 fragments as its driver lays out 16 x 16 matrices (glsl/coopmat_layout.comp on an
    H200): lane L holds rows L/4 and L/4 + 8, in each the columns 2 (L%4), 2 (L%4) + 1 and the same 8 further on;
    elements 0-3 are row L/4 (columns c, c + 1, c + 8, c + 9), 4-7 row L/4 + 8. The A operand (16 x 16 f16) and the
    accumulator (16 x 16 f32) share it, which lets a kernel turn accumulator elements into A elements lane by lane
    (attention's P from S) and reduce a row over the 4 lanes that hold it."""
    return lane // 4 + 8 * (i // 4), 2 * (lane % 4) + i % 2 + 8 * ((i // 2) % 2)


# name -> (lane, element index) -> (row, column), for 16 x 16 A and accumulator matrices of 8 elements a lane
COOPMAT_LAYOUTS = {"mma": _mma_layout}


# Fakes for tests and docs. Limits are plausible, not measured on hardware.
KNOWN_PROFILES: dict[str, DeviceProfile] = {
    "adreno-840": DeviceProfile(
        name="Adreno (TM) 840", vendor="adreno", vendor_id=0x5143, device_type="integrated",
        max_invocations=1024, max_local_size=(1024, 1024, 64), subgroup_size=64,
        max_push_constants=256, max_image_3d=16384, fp16=True, storage16=True),
    "mali-g715": DeviceProfile(
        name="Mali-G715", vendor="mali", vendor_id=0x13B5, device_type="integrated",
        max_invocations=1024, max_local_size=(1024, 1024, 1024), subgroup_size=16,
        max_image_3d=4096, fp16=True, storage16=True),
    "powervr": DeviceProfile(
        name="PowerVR D-Series DXT-48-1536", vendor="powervr", vendor_id=0x1010,
        device_type="integrated", max_invocations=512, max_local_size=(512, 512, 64),
        subgroup_size=32, fp16=True),
    "nvidia-h200": DeviceProfile(
        name="NVIDIA H200", vendor="nvidia", vendor_id=0x10DE, device_type="discrete",
        max_invocations=1024, max_local_size=(1024, 1024, 64), subgroup_size=32, subgroup_shuffle=True,
        max_shared_memory=49152, max_push_constants=256, max_image_3d=16384,
        max_group_count=(2**31 - 1, 65535, 65535), max_storage_buffer_range=2**32 - 1,
        min_storage_buffer_offset_alignment=16,
        fp16=True, storage16=True, cooperative_matrix=True,
        coopmat_shapes=((16, 16, 16, "f16", "f16", "f32", "f32"), (16, 8, 16, "f16", "f16", "f32", "f32"),
                        (16, 16, 16, "f16", "f16", "f16", "f16")), compute_units=132,
        coopmat_layout="mma"),
    "lavapipe": DeviceProfile(
        name="llvmpipe (LLVM 15.0.6, 256 bits)", vendor="llvmpipe", vendor_id=_MESA_ID,
        device_type="cpu", subgroup_size=8, subgroup_shuffle=True, max_shared_memory=32768, max_push_constants=128,
        max_image_3d=4096, min_storage_buffer_offset_alignment=16, fp16=True, storage16=True),
    # Small limits so tests exercise clamping.
    "tiny-limits": DeviceProfile(
        name="tiny-limits", max_invocations=128, max_local_size=(128, 128, 64), subgroup_size=4),
}
