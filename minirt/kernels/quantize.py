"""The dynamic quantization kernel family (glsl/dynamic_quantize.comp): one work group finds a tensor's range and
writes its uint8 codes less the zero point and the scale. Its local size is the group's width, halved until the
device takes it; the kernel loops over the tensor, so any width gives the same bits."""
from __future__ import annotations

from ..plan import Push

GROUP = 256


def dynamic_quantize_dispatch(ctx, x, q, s) -> None:
    group = GROUP
    while group > ctx.profile.max_invocations or group > ctx.profile.max_local_size[0]:
        group //= 2
    ctx.dispatch("dynamic_quantize", [(q.name, "w"), (s.name, "w"), (x.name, "r")],
                 Push().ivec4(x.numel, 0, 0, 0), (), (group, 1, 1), "reduction", flops=4 * x.numel,
                 nbytes=8 * x.numel, local_size=(group, 1, 1))
