"""The kernel families: what minirt knows about each kernel in glsl/ and how a node becomes its dispatches. One module
per family holds its tiles, splits, weight packing, push layout and work-group (local) size; the ops (minirt/ops/)
keep ONNX meaning and call a family to lower; the planner asks the families (never the ops' internals).

  local_size.py       the generic half of local sizes: device limits, the forced size, the shared rules
  rules.py            the one table from family (Dispatch.family) to its local-size rule, which the planner consults
  variants.py         variant names, specialization constants and epilogue activations of glsl/ (standard library
                      only: tools/build_shaders.py loads it by path)
  gemm.py             GEMM: glsl/gemm.comp, linear.comp (tiles, K splits, paired lanes), the tensor-core GEMMs
                      (linear_cm*, linear_cmreg*: tiles, packing, split reduce), linear_rows; the gemm and im2col rules
  attention_fp32.py   attention: the variant choice and the fp32 kernel (glsl/attention.comp) with its tiles
  attention_cm.py     attention on cooperative matrices, S and P through shared memory (glsl/attention_cm.comp)
  attention_cmr.py    attention on cooperative matrices, softmax in registers (glsl/attention_cmr.comp)
  attention_split.py  key and stream splits across work groups and the combine pass (glsl/attention_combine.comp)
  attention_cached.py the decoder's attention over a key/value cache (glsl/cached_attention.comp; query rows that
                      read one K/V row a work group: cached_attention_rows.comp)
  rows.py             the row kernels (glsl/layer_norm_rows.comp, linear_reduce.comp post=ln): a subgroup a row

Imports point one way: local_size <- the families <- minirt.ops <- minirt.planner (tests/test_import_graph.py).
The package hands on variants.py's names (minirt.kernels.spec, .variant, .act_code, ...): what ops and passes name
kernels with."""

from .variants import (ACT_AFTER_RES, ACTIVATIONS, AXES, DEFAULT_VALUES, RES_FIRST, ROW_VEC4_PER_LANE, SPEC_CONSTANTS,
                       Activation, act_code, activate, activation_of, clip, erf, spec, variant)

__all__ = ["ACT_AFTER_RES", "ACTIVATIONS", "AXES", "DEFAULT_VALUES", "RES_FIRST", "ROW_VEC4_PER_LANE", "SPEC_CONSTANTS",
           "Activation", "act_code", "activate", "activation_of", "clip", "erf", "spec", "variant"]
