"""Instance, physical-device choice, logical device and queue; and the DeviceProfile read from it."""
from __future__ import annotations

import dataclasses
import sys
import threading

from ..device_profile import DeviceProfile, classify_vendor, format_uuid
from ..errors import DeviceError
from ..options import environment

INSTALL_HINT = ("Install a Vulkan loader and driver: on Debian or Ubuntu "
                "`apt-get install libvulkan1 mesa-vulkan-drivers` (Mesa's lavapipe runs on the CPU), "
                "or your GPU vendor's driver.")

_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
# Preference when MINIRT_DEVICE does not choose: real GPUs first, the CPU driver last.
_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}


def import_vulkan():
    try:
        import vulkan
    except Exception as e:  # cffi raises OSError when libvulkan.so.1 cannot be opened
        if _memory_limit() is not None and ("map" in str(e) or "memory" in str(e)):
            # the dynamic loader could not map a library under a memory limit: not a missing package
            raise DeviceError(f"could not load the Vulkan bindings ({e}). "
                              + _failure_cause(None, INSTALL_HINT)) from None
        if isinstance(e, ImportError):
            raise DeviceError(f"the Python package 'vulkan' is missing ({e}); `pip install vulkan`. "
                              + INSTALL_HINT) from None
        raise DeviceError(f"could not load the Vulkan loader libvulkan.so.1 ({e}). " + INSTALL_HINT) from None
    return vulkan


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


# The Vulkan version minirt asks for: 1.3, which glsl/linear_cm2.comp's SPIR-V 1.6 needs (VK_NV_cooperative_matrix2);
# a device of an older version runs at its own (every other kernel is SPIR-V 1.3, Vulkan 1.1).
INSTANCE_API = (1, 3, 0)
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
DEBUG_UTILS = "VK_EXT_debug_utils"


def validation_enabled() -> bool:
    return environment().validation


# Every validation message of warning or error severity, in order, as "SEVERITY [id] text", with a
# "PERFORMANCE " prefix for messages that are only performance advice (MINIRT_VALIDATION=1 with
# VK_EXT_debug_utils present). Shared by every Device of the process
# (they share the one VkInstance); tests read it around each test (tests/conftest.py --validation).
validation_messages: list = []


class _Instance:
    """One VkInstance per process, shared by every Session; created on first use."""
    _lock = threading.Lock()
    _inst = None
    _messenger = None     # VkDebugUtilsMessengerEXT, lives as long as the instance
    _callback = None      # the cffi callback: must stay referenced while the messenger exists

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._inst is None:
                cls._inst = cls._create()
            return cls._inst

    @classmethod
    def _create(cls):
        vk = import_vulkan()
        app = vk.VkApplicationInfo(pApplicationName="minirt", applicationVersion=1, pEngineName="minirt",
                                   engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(*INSTANCE_API))
        layers, exts, messenger_info = [], [], None
        if validation_enabled():
            have = _instance_layers(vk)
            if VALIDATION_LAYER not in have:
                raise DeviceError(f"MINIRT_VALIDATION is set but the Vulkan validation layer {VALIDATION_LAYER} "
                                  f"is not installed: on Debian or Ubuntu `apt-get install vulkan-validationlayers` "
                                  f"(or unset MINIRT_VALIDATION)")
            layers = [VALIDATION_LAYER]
            if DEBUG_UTILS in _instance_extensions(vk, None) | _instance_extensions(vk, VALIDATION_LAYER):
                exts = [DEBUG_UTILS]
                messenger_info = cls._messenger_info(vk)
        info = vk.VkInstanceCreateInfo(pApplicationInfo=app, enabledLayerCount=len(layers),
                                       ppEnabledLayerNames=layers or None, enabledExtensionCount=len(exts),
                                       ppEnabledExtensionNames=exts or None)
        if messenger_info is not None:
            info.pNext = messenger_info      # messages from vkCreateInstance itself
        try:
            inst = vk.vkCreateInstance(info, None)
        except vk.VkError as e:
            raise DeviceError(f"vkCreateInstance failed ({type(e).__name__}): "
                              + _failure_cause(type(e).__name__, "no usable Vulkan driver. " + INSTALL_HINT)) \
                from None
        if messenger_info is not None:
            try:
                create = vk.vkGetInstanceProcAddr(inst, "vkCreateDebugUtilsMessengerEXT")
                cls._messenger = create(inst, messenger_info, None)
            except Exception as e:
                raise DeviceError(f"MINIRT_VALIDATION: could not create the {DEBUG_UTILS} messenger "
                                  f"({type(e).__name__}: {e})") from None
        return inst

    @classmethod
    def _messenger_info(cls, vk):
        """A VkDebugUtilsMessengerCreateInfoEXT (cdata pointer) whose callback appends warnings and errors
        to validation_messages and prints them to stderr (with a messenger, the layer prints nothing itself). The cffi callback is kept on the class: freeing it while the layer can
        still call it would crash the process."""
        ffi = vk.ffi
        names = {vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT: "ERROR",
                 vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT: "WARNING"}
        perf = vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT

        def on_message(severity, types, data, user):
            try:
                ident = ffi.string(data.pMessageIdName).decode(errors="replace") if data.pMessageIdName else ""
                text = ffi.string(data.pMessage).decode(errors="replace") if data.pMessage else ""
                kind = "PERFORMANCE " if types & perf and not types & ~perf else ""
                msg = f"{kind}{names.get(severity, severity)} [{ident}] {text}"
                validation_messages.append(msg)
                print(f"minirt: Vulkan validation: {msg}", file=sys.stderr, flush=True)   # as the layer would
            except Exception as e:     # never let an exception cross back into the driver
                validation_messages.append(f"ERROR [minirt] could not read a validation message: {e!r}")
            return vk.VK_FALSE

        cls._callback = ffi.callback("PFN_vkDebugUtilsMessengerCallbackEXT", on_message)
        return ffi.new("VkDebugUtilsMessengerCreateInfoEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            "messageSeverity": vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
                               | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            "messageType": vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                           | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                           | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            "pfnUserCallback": cls._callback})


def _instance_layers(vk) -> set:
    try:
        return {p.layerName for p in vk.vkEnumerateInstanceLayerProperties()}
    except vk.VkError:
        return set()


def _instance_extensions(vk, layer) -> set:
    try:
        return {p.extensionName for p in vk.vkEnumerateInstanceExtensionProperties(layer)}
    except vk.VkError:
        return set()


def _memory_limit() -> int | None:
    """The process's address-space or data limit in bytes (ulimit -v / -d), None where there is none."""
    try:
        import resource
    except ImportError:         # not on POSIX
        return None
    limits = [resource.getrlimit(r)[0] for r in (resource.RLIMIT_AS, getattr(resource, "RLIMIT_DATA", None))
              if r is not None]
    limits = [x for x in limits if x != resource.RLIM_INFINITY and x > 0]
    return min(limits) if limits else None


def _failure_cause(error: str | None, otherwise: str) -> str:
    """Why the driver failed to start, as far as can be told: a memory limit on the process (drivers map hundreds of
    MiB as they start: lavapipe's LLVM, a GPU driver's heaps, and report it as out of memory or a failed
    initialisation), an out-of-memory error, else `otherwise` (a missing driver)."""
    limit = _memory_limit()
    oom = error in ("VkErrorOutOfHostMemory", "VkErrorOutOfDeviceMemory")
    if limit is not None and error != "VkErrorIncompatibleDriver":
        cause = (f"The process's memory is limited to {limit / 2 ** 20:.0f} MiB (ulimit -v or -d), and Vulkan drivers "
                 f"reserve large regions as they start: raise or remove the limit")
        return cause + ("." if oom else f". If that is not it: {otherwise}")
    if oom:
        return "The host or the device is out of memory."
    return otherwise


def physical_devices():
    """[(index, VkPhysicalDevice, DeviceProfile)] in the loader's order."""
    vk = import_vulkan()
    inst = _Instance.get()
    error = None
    try:
        pds = vk.vkEnumeratePhysicalDevices(inst)
    except vk.VkError as e:
        pds, error = [], type(e).__name__
    if not pds:
        raise DeviceError("Vulkan found no physical device" + (f" ({error})" if error else "") + ". "
                          + _failure_cause(error, INSTALL_HINT))
    return [(i, pd, read_profile(vk, pd)) for i, pd in enumerate(pds)]


def read_profile(vk, pd) -> DeviceProfile:
    ffi = vk.ffi
    props = vk.vkGetPhysicalDeviceProperties(pd)
    lim = props.limits
    exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}
    sub = ffi.new("VkPhysicalDeviceSubgroupProperties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES})
    # multiprocessor counts, chained only where the extension is listed
    sms = ffi.new("VkPhysicalDeviceShaderSMBuiltinsPropertiesNV*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV, "pNext": sub})
    cus = ffi.new("VkPhysicalDeviceShaderCoreProperties2AMD*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_2_AMD, "pNext": sub})
    head = sms if SM_BUILTINS in exts else cus if AMD_CORES in exts else sub
    drv = ffi.new("VkPhysicalDeviceDriverProperties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
                                                        "pNext": head})
    m3 = ffi.new("VkPhysicalDeviceMaintenance3Properties*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, "pNext": drv})
    ids = ffi.new("VkPhysicalDeviceIDProperties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES,
                                                    "pNext": m3})
    p2 = ffi.new("VkPhysicalDeviceProperties2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": ids})
    has_cm2 = COOPMAT2 in exts and COOPMAT in exts
    cm2_props = _cm2_struct(vk, p2, "props") if has_cm2 else None
    vk.vkGetPhysicalDeviceProperties2(pd, p2)
    units = sms.shaderSMCount if head is sms else cus.activeComputeUnitCount if head is cus else 0
    f16 = ffi.new("VkPhysicalDeviceShaderFloat16Int8Features*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES})
    s8 = ffi.new("VkPhysicalDevice8BitStorageFeatures*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES, "pNext": f16})
    s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, "pNext": s8})
    mm = ffi.new("VkPhysicalDeviceVulkanMemoryModelFeatures*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, "pNext": s16})
    cm = ffi.new("VkPhysicalDeviceCooperativeMatrixFeaturesKHR*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, "pNext": mm})
    has_cm = COOPMAT in exts
    f2 = ffi.new("VkPhysicalDeviceFeatures2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                                 "pNext": cm if has_cm else s16})
    cm2_feats = _cm2_struct(vk, f2, "features") if has_cm2 else None
    vk.vkGetPhysicalDeviceFeatures2(pd, f2)
    shapes = _coopmat_shapes(vk, pd) if has_cm and cm.cooperativeMatrix and mm.vulkanMemoryModel else ()
    cooperative = bool(shapes and f16.shaderFloat16 and s16.storageBuffer16BitAccess)
    cm2, cm2_missing = (_coopmat2(vk, pd, props.apiVersion, cooperative, cm2_feats[1]) if has_cm2 else ((), ""))
    qf = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
    bits = next((q.timestampValidBits for q in qf if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), 0)
    name = props.deviceName
    # the heaps that Device.memory_type's first choice for device-local and for host-visible memory come from
    mp = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    heaps = [next((mp.memoryTypes[i].heapIndex for i in range(mp.memoryTypeCount)
                   if mp.memoryTypes[i].propertyFlags & flag), None)
             for flag in (vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)]
    device_heap, host_heap = (0 if h is None else int(mp.memoryHeaps[h].size) for h in heaps)
    return DeviceProfile(
        name=name, vendor=classify_vendor(props.vendorID, name), vendor_id=props.vendorID,
        device_type=_TYPES.get(props.deviceType, "other"), api_version=_version(props.apiVersion),
        driver=f"{ffi.string(drv.driverName).decode()} {ffi.string(drv.driverInfo).decode()}".strip(),
        max_invocations=lim.maxComputeWorkGroupInvocations,
        max_local_size=tuple(lim.maxComputeWorkGroupSize), max_group_count=tuple(lim.maxComputeWorkGroupCount),
        subgroup_size=sub.subgroupSize, max_shared_memory=lim.maxComputeSharedMemorySize,
        subgroup_shuffle=bool(sub.supportedOperations & vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT
                              and sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT),
        max_push_constants=lim.maxPushConstantsSize, max_image_3d=lim.maxImageDimension3D,
        max_storage_buffer_range=lim.maxStorageBufferRange,
        min_storage_buffer_offset_alignment=lim.minStorageBufferOffsetAlignment,
        fp16=bool(f16.shaderFloat16), storage16=bool(s16.storageBuffer16BitAccess),
        storage8=bool(s8.storageBuffer8BitAccess),
        cooperative_matrix=cooperative, coopmat_shapes=shapes, coopmat2=cm2,
        coopmat2_max_dimension=int(cm2_props[1].cooperativeMatrixFlexibleDimensionsMaxDimension) if cm2 else 0,
        coopmat2_missing=cm2_missing,
        timestamp_period=float(lim.timestampPeriod), timestamp_valid_bits=int(bits), compute_units=int(units),
        device_heap=device_heap, host_heap=host_heap, unified_heap=heaps[0] is not None and heaps[0] == heaps[1],
        max_allocation=int(m3.maxMemoryAllocationSize), uuid=format_uuid(bytes(ids.deviceUUID)))


COOPMAT = "VK_KHR_cooperative_matrix"
COOPMAT2 = "VK_NV_cooperative_matrix2"
SM_BUILTINS = "VK_NV_shader_sm_builtins"
AMD_CORES = "VK_AMD_shader_core_properties2"
HOST_IMPORT = "VK_EXT_external_memory_host"
PIPELINE_STATS = "VK_KHR_pipeline_executable_properties"
_COMPONENT = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64", 7: "u8", 8: "u16", 9: "u32",
              10: "u64", 1000141000: "bf16"}


def _coopmat_shapes(vk, pd) -> tuple:
    """Subgroup-scope (M, N, K, A, B, C, result) combinations of VK_KHR_cooperative_matrix. Called through the raw
    entry point: the binding's wrapper leaves each element's sType unset."""
    ffi = vk.ffi
    addr = vk.lib.vkGetInstanceProcAddr(_Instance.get(), b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    if addr == ffi.NULL:
        return ()
    fn = ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", addr)
    n = ffi.new("uint32_t*")
    if fn(pd, n, ffi.NULL) != vk.VK_SUCCESS or not n[0]:
        return ()
    props = ffi.new("VkCooperativeMatrixPropertiesKHR[]", n[0])
    for i in range(n[0]):
        props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    if fn(pd, n, props) != vk.VK_SUCCESS:
        return ()
    out = []
    for p in props[0:n[0]]:
        if p.scope == vk.VK_SCOPE_SUBGROUP_KHR:
            out.append((p.MSize, p.NSize, p.KSize, *(_COMPONENT.get(t, str(t)) for t in
                                                     (p.AType, p.BType, p.CType, p.ResultType))))
    return tuple(out)


# VK_NV_cooperative_matrix2's structs, which the `vulkan` binding (1.3.275) predates: declared here from
# Vulkan-Headers' vulkan_core.h (enums and VkBool32 as the uint32_t they are), in an FFI of their own; a struct is
# chained into the binding's pNext chains by address, and kept referenced until the call that reads it returns.
_CM2_CDEF = """
typedef struct {
    uint32_t sType; void* pNext;
    uint32_t cooperativeMatrixWorkgroupScope, cooperativeMatrixFlexibleDimensions, cooperativeMatrixReductions,
             cooperativeMatrixConversions, cooperativeMatrixPerElementOperations, cooperativeMatrixTensorAddressing,
             cooperativeMatrixBlockLoads;
} VkPhysicalDeviceCooperativeMatrix2FeaturesNV;
typedef struct {
    uint32_t sType; void* pNext;
    uint32_t cooperativeMatrixWorkgroupScopeMaxWorkgroupSize, cooperativeMatrixFlexibleDimensionsMaxDimension,
             cooperativeMatrixWorkgroupScopeReservedSharedMemory;
} VkPhysicalDeviceCooperativeMatrix2PropertiesNV;
typedef struct {
    uint32_t sType; void* pNext;
    uint32_t MGranularity, NGranularity, KGranularity, AType, BType, CType, ResultType, saturatingAccumulation, scope,
             workgroupInvocations;
} VkCooperativeMatrixFlexibleDimensionsPropertiesNV;
typedef int32_t (*PFN_flexible)(void*, uint32_t*, VkCooperativeMatrixFlexibleDimensionsPropertiesNV*);
"""
_STYPE_CM2_FEATURES = 1000593000        # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV
_STYPE_CM2_FLEXIBLE = 1000593001        # VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_FLEXIBLE_DIMENSIONS_PROPERTIES_NV
_STYPE_CM2_PROPERTIES = 1000593002      # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV
_SCOPE_WORKGROUP = 2                    # VK_SCOPE_WORKGROUP_KHR
# the features glsl/linear_cm2.comp uses (its SPIR-V capabilities, workgroup scope and its block sizes)
CM2_FEATURES = ("cooperativeMatrixWorkgroupScope", "cooperativeMatrixFlexibleDimensions",
                "cooperativeMatrixPerElementOperations", "cooperativeMatrixTensorAddressing")
_cm2_ffi = None


def cm2_ffi():
    global _cm2_ffi
    if _cm2_ffi is None:
        import cffi
        _cm2_ffi = cffi.FFI()
        _cm2_ffi.cdef(_CM2_CDEF)
    return _cm2_ffi


def _address(ffi, cdata) -> int:
    return int(ffi.cast("uintptr_t", cdata))


def _cm2_struct(vk, head, kind):
    """A VK_NV_cooperative_matrix2 features or properties struct chained first after `head` (a binding struct with
    pNext): (the binding's void* to it, the struct). Keep both referenced until the query returns."""
    ffi = cm2_ffi()
    ctype, stype = (("VkPhysicalDeviceCooperativeMatrix2FeaturesNV*", _STYPE_CM2_FEATURES) if kind == "features" else
                    ("VkPhysicalDeviceCooperativeMatrix2PropertiesNV*", _STYPE_CM2_PROPERTIES))
    s = ffi.new(ctype, {"sType": stype, "pNext": ffi.cast("void*", _address(vk.ffi, head.pNext))})
    ptr = vk.ffi.cast("void*", _address(ffi, s))
    head.pNext = ptr
    return ptr, s


def _coopmat2(vk, pd, api_version, cooperative, feats) -> tuple:
    """(DeviceProfile.coopmat2, DeviceProfile.coopmat2_missing) of a device listing VK_NV_cooperative_matrix2."""
    missing = [f for f in CM2_FEATURES if not getattr(feats, f)]
    if missing:
        return (), f"{COOPMAT2} lacks the feature{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    if (api_version >> 22, (api_version >> 12) & 0x3FF) < (1, 3):
        return (), f"{COOPMAT2} needs Vulkan 1.3 (its kernels are SPIR-V 1.6); the device has {_version(api_version)}"
    if not cooperative:
        return (), f"{COOPMAT2} needs {COOPMAT} with the 16x16x16 f16 shapes, shaderFloat16 and 16-bit storage"
    ffi = cm2_ffi()
    name = "vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV"
    addr = vk.lib.vkGetInstanceProcAddr(_Instance.get(), name.encode())
    if addr == vk.ffi.NULL:
        return (), f"{COOPMAT2}: the loader has no {name}"
    fn = ffi.cast("PFN_flexible", _address(vk.ffi, addr))
    handle = ffi.cast("void*", _address(vk.ffi, pd))
    n = ffi.new("uint32_t*")
    if fn(handle, n, ffi.NULL) != 0 or not n[0]:
        return (), f"{COOPMAT2} reports no flexible-dimension matrix types"
    props = ffi.new("VkCooperativeMatrixFlexibleDimensionsPropertiesNV[]", n[0])
    for i in range(n[0]):
        props[i].sType = _STYPE_CM2_FLEXIBLE
    if fn(handle, n, props) != 0:
        return (), f"{COOPMAT2}: {name} failed"
    found = []
    for p in props[0:n[0]]:
        types = tuple(_COMPONENT.get(t, str(t)) for t in (p.AType, p.BType, p.CType, p.ResultType))
        if p.scope == _SCOPE_WORKGROUP and types == ("f16", "f16", "f32", "f32") and not p.saturatingAccumulation:
            found.append((int(p.MGranularity), int(p.NGranularity), int(p.KGranularity), int(p.workgroupInvocations)))
    if not found:
        return (), f"{COOPMAT2} has no workgroup-scope f16 x f16 -> f32 flexible dimensions"
    return tuple(sorted(set(found))), ""


_HEX = frozenset("0123456789abcdef")


def parse_device(spec):
    """A device as Session(device=), --device and MINIRT_DEVICE give it: None (not given: "" too), an index (an int,
    or text of digits), or a UUID as lowercase hex digits without dashes (text of hex digits, dashes allowed, with or
    without nvidia-smi's "GPU-" prefix; fewer than 32 digits are a prefix that must name one device).
    ValueError says why anything else is neither."""
    if spec is None:
        return None
    if isinstance(spec, bool) or not isinstance(spec, (int, str)):
        raise ValueError(f"a device index or UUID, not {type(spec).__name__}")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError("a device index is >= 0")
        return spec
    s = spec.strip().lower()
    if not s:
        return None
    if s.isdigit() and len(s) < 32:
        return int(s)
    if s.startswith("mig-"):
        raise ValueError("a MIG instance is not a Vulkan device; give its GPU's UUID (nvidia-smi -L)")
    digits = (s[4:] if s.startswith("gpu-") else s).replace("-", "")
    if not digits or len(digits) > 32 or not set(digits) <= _HEX:
        raise ValueError("a device index or UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as `minirt devices` and "
                         "nvidia-smi -L show it)")
    return digits


def choose(devices, spec=None):
    """Pick one of `devices` ([(index, VkPhysicalDevice, DeviceProfile)]): `spec` as parse_device takes it (None:
    MINIRT_DEVICE) when given, else discrete > integrated > virtual > CPU. DeviceError names the spec and, for a UUID
    that matches no device or several, lists the devices' UUIDs."""
    label = "device"
    if spec is None:
        spec, label = environment().device, "MINIRT_DEVICE"
    shown = f"MINIRT_DEVICE={spec}" if label == "MINIRT_DEVICE" else f"device {spec!r}"
    try:
        want = parse_device(spec)
    except ValueError as e:
        raise DeviceError(f"{shown} is not a device index or UUID: {e}") from None
    if want is None:
        return min(devices, key=lambda d: (_RANK[d[2].device_type], d[0]))
    if isinstance(want, int):
        for d in devices:
            if d[0] == want:
                return d
        raise DeviceError(f"{shown} but only devices 0..{len(devices) - 1} exist (see `minirt devices`)")
    hits = [d for d in devices if d[2].uuid and d[2].uuid.replace("-", "").startswith(want)]
    if len(hits) == 1:
        return hits[0]
    listing = "; ".join(f"[{i}] {p.name}: {p.uuid or 'no UUID'}" for i, _, p in devices)
    raise DeviceError(f"{shown} matches {'no' if not hits else 'more than one'} Vulkan device's UUID "
                      f"(the devices: {listing})")


class Device:
    """A logical device with one compute queue. Shared by Sessions on the same physical device."""

    def __init__(self, chosen):
        """chosen: one (index, VkPhysicalDevice, DeviceProfile) of physical_devices(), as choose() picks it."""
        vk = self.vk = import_vulkan()
        self.index, self.pd, self.profile = chosen
        qf = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.pd)
        self.family = next(i for i, q in enumerate(qf) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
        prio = vk.ffi.new("float[1]", [1.0])
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1, pQueuePriorities=prio)
        exts, chain = self._features(vk)    # chain: the feature structs; referenced until vkCreateDevice returns
        self.host_import_alignment = self._host_import_alignment(vk) if HOST_IMPORT in exts else 0
        info = vk.VkDeviceCreateInfo(queueCreateInfoCount=1, pQueueCreateInfos=[qinfo], pNext=chain[-1] if chain else None,
                                     enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts or None)
        try:
            self.device = vk.vkCreateDevice(self.pd, info, None)
        except vk.VkError as e:
            raise DeviceError(f"vkCreateDevice failed on '{self.profile.name}': {type(e).__name__}") from None
        self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
        self.host_pointer_properties = None    # raw vkGetMemoryHostPointerPropertiesEXT, when importing host memory
        # MINIRT_PIPELINE_STATS=1: the driver's statistics of each compiled pipeline (registers, shared memory, ...),
        # read by Kernels.statistics; a diagnostic, off by default (capturing may cost compile time)
        self.executable_statistics = None
        if PIPELINE_STATS in exts:
            addr = vk.lib.vkGetDeviceProcAddr(self.device, b"vkGetPipelineExecutableStatisticsKHR")
            if addr != vk.ffi.NULL:
                self.executable_statistics = vk.ffi.cast("PFN_vkGetPipelineExecutableStatisticsKHR", addr)
        if self.host_import_alignment:
            addr = vk.lib.vkGetDeviceProcAddr(self.device, b"vkGetMemoryHostPointerPropertiesEXT")
            if addr != vk.ffi.NULL:
                self.host_pointer_properties = vk.ffi.cast("PFN_vkGetMemoryHostPointerPropertiesEXT", addr)
            else:
                self.host_import_alignment = 0
        self.mem_props = vk.vkGetPhysicalDeviceMemoryProperties(self.pd)
        # serialises this queue's submissions and waits across the Sessions and Programs on this device; one per
        # Device, so runs on two devices of one process overlap
        self.lock = threading.Lock()
        self.live = 0                     # Sessions using it
        self.validation_messages = validation_messages   # MINIRT_VALIDATION=1: warnings and errors, in order
        p = self.profile
        if p.cooperative_matrix and p.subgroup_size == 32 and (16, 16, 16, "f16", "f16", "f32", "f32") in p.coopmat_shapes:
            from .coopmat_probe import probe      # one small dispatch, once per device
            self.profile = dataclasses.replace(p, coopmat_layout=probe(self))

    def _host_import_alignment(self, vk) -> int:
        ffi = vk.ffi
        hp = ffi.new("VkPhysicalDeviceExternalMemoryHostPropertiesEXT*",
                     {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT})
        p2 = ffi.new("VkPhysicalDeviceProperties2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                                      "pNext": hp})
        vk.vkGetPhysicalDeviceProperties2(self.pd, p2)
        return int(hp.minImportedHostPointerAlignment)

    def _features(self, vk):
        """Extensions and feature structs (a pNext chain, last element first in the chain) that precision fp16
        and the cooperative-matrix kernels use, for whichever of them the device has."""
        ffi, p = vk.ffi, self.profile
        have = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(self.pd, None)}
        exts, chain = [], []

        def add(ctype, stype, **fields):
            chain.append(ffi.new(ctype, {"sType": stype, "pNext": chain[-1] if chain else ffi.NULL, **fields}))

        if p.storage16:
            exts += [e for e in ("VK_KHR_16bit_storage", "VK_KHR_storage_buffer_storage_class") if e in have]
            add("VkPhysicalDevice16BitStorageFeatures*", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
                storageBuffer16BitAccess=1)
        if p.storage8 and p.coopmat2:     # linear_cm2's int8 weights (the only 8-bit loads)
            exts += [e for e in ("VK_KHR_8bit_storage",) if e in have and e not in exts]
            add("VkPhysicalDevice8BitStorageFeatures*", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES,
                storageBuffer8BitAccess=1)
        if p.fp16:
            exts += [e for e in ("VK_KHR_shader_float16_int8",) if e in have]
            add("VkPhysicalDeviceShaderFloat16Int8Features*",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, shaderFloat16=1)
        if HOST_IMPORT in have:    # zero-copy outputs (minirt/vk/zero_copy.py)
            exts += [e for e in ("VK_KHR_external_memory", HOST_IMPORT) if e in have]
        if PIPELINE_STATS in have and environment().pipeline_stats:
            exts.append(PIPELINE_STATS)
            add("VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR*",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
                pipelineExecutableInfo=1)
        if p.cooperative_matrix:
            exts += [e for e in ("VK_KHR_vulkan_memory_model", COOPMAT) if e in have]
            add("VkPhysicalDeviceVulkanMemoryModelFeatures*",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, vulkanMemoryModel=1)
            add("VkPhysicalDeviceCooperativeMatrixFeaturesKHR*",
                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, cooperativeMatrix=1)
        if p.coopmat2 and COOPMAT2 in have:
            # the features linear_cm2 uses (read_profile checked them), in a struct of cm2_ffi's chained by address:
            # chain keeps the struct, then the binding's pointer to it (the head vkCreateDevice gets)
            ffi2 = cm2_ffi()
            s = ffi2.new("VkPhysicalDeviceCooperativeMatrix2FeaturesNV*", {
                "sType": _STYPE_CM2_FEATURES, "pNext": ffi2.cast("void*", _address(ffi, chain[-1]) if chain else 0),
                **{f: 1 for f in CM2_FEATURES}})
            exts.append(COOPMAT2)
            chain += [s, ffi.cast("void*", _address(ffi2, s))]
        return exts, chain

    def memory_type(self, type_bits: int, want: int, avoid: int = 0) -> int:
        """First memory type allowed by type_bits with all `want` flags, preferring ones without `avoid`."""
        mp = self.mem_props
        ok = [i for i in range(mp.memoryTypeCount)
              if type_bits & (1 << i) and (mp.memoryTypes[i].propertyFlags & want) == want]
        if not ok:
            raise DeviceError(f"'{self.profile.name}' has no memory type with flags {want:#x}")
        best = [i for i in ok if not mp.memoryTypes[i].propertyFlags & avoid]
        return (best or ok)[0]

    def is_coherent(self, mem_type: int) -> bool:
        return bool(self.mem_props.memoryTypes[mem_type].propertyFlags
                    & self.vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
