"""Barriers and image copy regions: the command arguments that both the weight upload and the recorder build."""
from __future__ import annotations


def color_range(vk):
    """The one mip level and layer of every minirt image."""
    return vk.VkImageSubresourceRange(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, baseMipLevel=0, levelCount=1,
                                      baseArrayLayer=0, layerCount=1)


def region(vk, extents):
    """A whole image to or from tightly packed texels at the start of a buffer."""
    layers = vk.VkImageSubresourceLayers(aspectMask=vk.VK_IMAGE_ASPECT_COLOR_BIT, mipLevel=0, baseArrayLayer=0,
                                         layerCount=1)
    return vk.VkBufferImageCopy(bufferOffset=0, bufferRowLength=0, bufferImageHeight=0, imageSubresource=layers,
                                imageOffset=vk.VkOffset3D(0, 0, 0), imageExtent=vk.VkExtent3D(*extents))


def memory_barrier(vk, cmd, src_stage, src_access, dst_stage, dst_access):
    mb = vk.VkMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access)
    vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)


def image_barrier(vk, cmd, images, old, src_access, src_stage, dst_access, dst_stage):
    """Every image of `images` into GENERAL, the only layout minirt uses, from `old` (UNDEFINED drops the contents)."""
    bars = [vk.VkImageMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access, oldLayout=old,
                                    newLayout=vk.VK_IMAGE_LAYOUT_GENERAL,
                                    srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                    dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                    image=img, subresourceRange=color_range(vk)) for img in images]
    vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 0, None, 0, None, len(bars), bars)
