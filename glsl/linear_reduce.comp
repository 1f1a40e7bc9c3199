#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: dtype=float,half io=elem,out32
// exclude: dtype=float io=out32
// The second half of a split-K GEMM (linear.comp OUT_MODE 3, linear_cm_split.comp): out[m, n] = act(sum_s part[s][m][n] + bias[n])
// (+ residual[m, n]), out row-major [M, N]. The S partials are added in split order, so every run gives the same bits.
// One invocation per (vec4 column n4, row m).
#include "common.glslh"

layout(constant_id = 3) const int ACT = 0;          // 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh)
layout(constant_id = 4) const bool HAS_RES = false; // + residual[m, n]

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { OUT_ELEM o[]; };
layout(set = 0, binding = 0, std430) writeonly buffer o4_buf { OUT_ELEM4 o4[]; };
layout(set = 0, binding = 1, std430) readonly buffer part_buf { vec4 part4[]; };
layout(set = 0, binding = 2, std430) readonly buffer bias_buf { ELEM4 bias4[]; };
layout(set = 0, binding = 3, std430) readonly buffer r_buf { ELEM res[]; };
layout(set = 0, binding = 3, std430) readonly buffer r4_buf { ELEM4 res4[]; };

layout(push_constant) uniform Params {
  ivec4 dims;   // M, N, N4, S
} p;

float activate(float x) {
  if (ACT == 1) return relu_f(x);
  if (ACT == 2) return 0.5 * x * (1.0 + erf_f(x * 0.70710678118654752));
  if (ACT == 3) return 0.5 * x * (1.0 + tanh_f(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  return x;
}

void main() {
  const int n4 = int(gl_GlobalInvocationID.x), m = int(gl_GlobalInvocationID.y);
  const int M = p.dims.x, N = p.dims.y, N4 = p.dims.z, S = p.dims.w;
  if (n4 >= N4 || m >= M) return;
  vec4 v = part4[m * N4 + n4];
  for (int s = 1; s < S; ++s) v += part4[(s * M + m) * N4 + n4];
  v += W4(bias4, n4);
  v = vec4(activate(v.x), activate(v.y), activate(v.z), activate(v.w));
  const int n = n4 * 4, rem = min(N - n, 4), idx = m * N + n;
  if ((N & 3) == 0) {
    o4[idx >> 2] = to_out4(v + (HAS_RES ? vec4(res4[idx >> 2]) : vec4(0.0)));
  } else {
    [[unroll]] for (int l = 0; l < 4; ++l)
      if (l < rem) o[idx + l] = to_out(v[l] + (HAS_RES ? float(res[idx + l]) : 0.0));
  }
}
