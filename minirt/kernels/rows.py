"""The row kernels: glsl/layer_norm_rows.comp and linear_reduce.comp post=ln give each subgroup a row held in
registers (minirt.kernels.variants.ROW_VEC4_PER_LANE vec4 a lane), several rows a work group. Their work group is
sized here."""
from __future__ import annotations

import numpy as np

from ..device_profile import DeviceProfile
from ..plan import Push
from .local_size import DEFAULT_INVOCATIONS
from .variants import spec

# The small one-pass kernels take DeviceProfile.tuning.small_pass_invocations a work group where it is set (64, the
# default, elsewhere). On an H200 (docs/benchmarks.md), with 256:
#   - the row kernels (layer_norm_rows, linear_reduce post=ln: one subgroup a row, so 8 rows a group instead of 2)
#     took about 3 us less over Whisper-tiny's nine passes (span 1.501 -> 1.498 ms);
#   - the attention combine pass (minirt/kernels/attention_split.py head_rows_shape).


def row_invocations(profile: DeviceProfile, forced=None) -> int:
    """Invocations a work group of the row kernels: `forced`, the device table's figure or 64, raised to one whole
    subgroup (the kernels give each subgroup a row)."""
    n = forced or profile.tuning.small_pass_invocations or DEFAULT_INVOCATIONS
    return max(n, profile.subgroup_size, 1)


def layer_norm_rows(ctx, node, x, out, consts):
    """LayerNorm over a last dim that is a multiple of 4, in buffers: one subgroup per row. consts: the scale (and
    bias) arrays."""
    length = x.shape[-1]
    rows = int(np.prod(x.shape[:-1]))
    # invocations a work group (the device table's, else 64; option rows_invocations), one row a subgroup
    inv = row_invocations(ctx.profile, ctx.options.rows_invocations)
    per = inv // max(ctx.profile.subgroup_size, 1)     # rows a work group (the kernel loops if it gets fewer)
    aff = np.concatenate([np.broadcast_to(np.asarray(a, np.float32), (length,)) for a in consts])
    w = ctx.weight(f"{node.name}/scale_bias", aff)
    eps, has_bias = node.attrs.get("epsilon", 1e-5), len(consts) > 1
    p = Push().ivec4(rows, length // 4, per).vec4(eps)
    ctx.dispatch("layer_norm_rows", [(out.name, "w"), (x.name, "r"), (w.name, "r")], p,
                 spec("layer_norm_rows", HAS_BIAS=has_bias), (inv, -(-rows // per), 1), "reduction",
                 flops=8 * x.numel, nbytes=8 * x.numel, io="out32",
                 info={"rows": rows, "n4": length // 4, "rows_per_group": per, "eps": eps, "has_bias": has_bias})
