"""Instance, physical-device choice, logical device and queue; and the DeviceProfile read from it."""
from __future__ import annotations

import os
import threading

from ..device_profile import DeviceProfile, classify_vendor
from ..errors import DeviceError

INSTALL_HINT = ("Install a Vulkan loader and driver: on Debian or Ubuntu "
                "`apt-get install libvulkan1 mesa-vulkan-drivers` (Mesa's lavapipe runs on the CPU), "
                "or your GPU vendor's driver.")

_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
# Preference when MINIRT_DEVICE does not choose: real GPUs first, the CPU driver last.
_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}


def import_vulkan():
    try:
        import vulkan
    except ImportError as e:
        raise DeviceError(f"the Python package 'vulkan' is missing ({e}); `pip install vulkan`. "
                          + INSTALL_HINT) from None
    except Exception as e:  # cffi raises OSError when libvulkan.so.1 cannot be opened
        raise DeviceError(f"could not load the Vulkan loader libvulkan.so.1 ({e}). " + INSTALL_HINT) from None
    return vulkan


def _version(v: int) -> str:
    return f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


class _Instance:
    """One VkInstance per process, shared by every Session; created on first use."""
    _lock = threading.Lock()
    _inst = None

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._inst is None:
                cls._inst = cls._create()
            return cls._inst

    @staticmethod
    def _create():
        vk = import_vulkan()
        app = vk.VkApplicationInfo(pApplicationName="minirt", applicationVersion=1, pEngineName="minirt",
                                   engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))
        layers = []
        if os.environ.get("MINIRT_VALIDATION", "") not in ("", "0"):
            layers = ["VK_LAYER_KHRONOS_validation"]
        info = vk.VkInstanceCreateInfo(pApplicationInfo=app, enabledLayerCount=len(layers),
                                       ppEnabledLayerNames=layers or None)
        try:
            return vk.vkCreateInstance(info, None)
        except vk.VkError as e:
            raise DeviceError(f"vkCreateInstance failed ({type(e).__name__}): no usable Vulkan driver. "
                              + INSTALL_HINT) from None


def physical_devices():
    """[(index, VkPhysicalDevice, DeviceProfile)] in the loader's order."""
    vk = import_vulkan()
    inst = _Instance.get()
    try:
        pds = vk.vkEnumeratePhysicalDevices(inst)
    except vk.VkError:
        pds = []
    if not pds:
        raise DeviceError("Vulkan found no physical device. " + INSTALL_HINT)
    return [(i, pd, read_profile(vk, pd)) for i, pd in enumerate(pds)]


def read_profile(vk, pd) -> DeviceProfile:
    ffi = vk.ffi
    props = vk.vkGetPhysicalDeviceProperties(pd)
    lim = props.limits
    sub = ffi.new("VkPhysicalDeviceSubgroupProperties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES})
    drv = ffi.new("VkPhysicalDeviceDriverProperties*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
                                                        "pNext": sub})
    p2 = ffi.new("VkPhysicalDeviceProperties2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": drv})
    vk.vkGetPhysicalDeviceProperties2(pd, p2)
    exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}
    f16 = ffi.new("VkPhysicalDeviceShaderFloat16Int8Features*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES})
    s16 = ffi.new("VkPhysicalDevice16BitStorageFeatures*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES, "pNext": f16})
    f2 = ffi.new("VkPhysicalDeviceFeatures2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": s16})
    vk.vkGetPhysicalDeviceFeatures2(pd, f2)
    qf = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
    bits = next((q.timestampValidBits for q in qf if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), 0)
    name = props.deviceName
    return DeviceProfile(
        name=name, vendor=classify_vendor(props.vendorID, name), vendor_id=props.vendorID,
        device_type=_TYPES.get(props.deviceType, "other"), api_version=_version(props.apiVersion),
        driver=f"{ffi.string(drv.driverName).decode()} {ffi.string(drv.driverInfo).decode()}".strip(),
        max_invocations=lim.maxComputeWorkGroupInvocations,
        max_local_size=tuple(lim.maxComputeWorkGroupSize), max_group_count=tuple(lim.maxComputeWorkGroupCount),
        subgroup_size=sub.subgroupSize, max_shared_memory=lim.maxComputeSharedMemorySize,
        max_push_constants=lim.maxPushConstantsSize, max_image_3d=lim.maxImageDimension3D,
        max_storage_buffer_range=lim.maxStorageBufferRange,
        min_storage_buffer_offset_alignment=lim.minStorageBufferOffsetAlignment,
        fp16=bool(f16.shaderFloat16), storage16=bool(s16.storageBuffer16BitAccess),
        cooperative_matrix="VK_KHR_cooperative_matrix" in exts,
        timestamp_period=float(lim.timestampPeriod), timestamp_valid_bits=int(bits))


def choose(devices, env=None):
    """Pick a device: MINIRT_DEVICE=<index> if set, else discrete > integrated > virtual > CPU."""
    env = os.environ.get("MINIRT_DEVICE", "") if env is None else env
    if env.strip():
        try:
            idx = int(env)
        except ValueError:
            raise DeviceError(f"MINIRT_DEVICE must be a device index (see `minirt devices`), got {env!r}") from None
        for d in devices:
            if d[0] == idx:
                return d
        raise DeviceError(f"MINIRT_DEVICE={idx} but only devices 0..{len(devices) - 1} exist (see `minirt devices`)")
    return min(devices, key=lambda d: (_RANK[d[2].device_type], d[0]))


class Device:
    """A logical device with one compute queue. Shared by Sessions on the same physical device."""

    def __init__(self, index=None):
        vk = self.vk = import_vulkan()
        devs = physical_devices()
        self.index, self.pd, self.profile = choose(devs, None if index is None else str(index))
        qf = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.pd)
        self.family = next(i for i, q in enumerate(qf) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
        prio = vk.ffi.new("float[1]", [1.0])
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.family, queueCount=1, pQueuePriorities=prio)
        info = vk.VkDeviceCreateInfo(queueCreateInfoCount=1, pQueueCreateInfos=[qinfo])
        try:
            self.device = vk.vkCreateDevice(self.pd, info, None)
        except vk.VkError as e:
            raise DeviceError(f"vkCreateDevice failed on '{self.profile.name}': {type(e).__name__}") from None
        self.queue = vk.vkGetDeviceQueue(self.device, self.family, 0)
        self.mem_props = vk.vkGetPhysicalDeviceMemoryProperties(self.pd)
        self.lock = threading.Lock()      # serialises queue submission across Sessions
        self.live = 0                     # Sessions using it

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
