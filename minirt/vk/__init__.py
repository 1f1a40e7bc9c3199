"""The Vulkan executor: the only package of minirt that imports `vulkan`."""
