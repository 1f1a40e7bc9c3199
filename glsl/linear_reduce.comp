#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#if defined(POST_LN)
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_ballot : require
#endif
// variants: post=none,ln dtype=float,half io=elem,out32
// exclude: dtype=float io=out32
// The second half of a split-K GEMM (linear.comp OUT_MODE 3, linear_cm_split.comp): out[m, n] = act(sum_s part[s][m][n] + bias[n])
// (+ residual[m, n]), out row-major [M, N]. The S partials are added in split order, so every run gives the same bits.
// One invocation per (vec4 column n4, row m).
// post=ln (the fuse_reduce_layer_norm plan pass): the same sums, one subgroup per row as in layer_norm_rows.comp, and
// the row, held in registers, is also normalised: binding 0 gets LayerNorm(out) (io=out32: as float32), binding 5
// the GEMM's own output. Rows of up to REG x subgroup size vec4 (the pass checks).
#include "common.glslh"

layout(constant_id = 3) const int ACT = 0;          // ACT_* of activation.glslh
layout(constant_id = 4) const bool HAS_RES = false; // + residual[m, n]

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { OUT_ELEM o[]; };
layout(set = 0, binding = 0, std430) writeonly buffer o4_buf { OUT_ELEM4 o4[]; };
layout(set = 0, binding = 1, std430) readonly buffer part_buf { vec4 part4[]; };
layout(set = 0, binding = 2, std430) readonly buffer bias_buf { ELEM4 bias4[]; };
layout(set = 0, binding = 3, std430) readonly buffer r_buf { ELEM res[]; };
layout(set = 0, binding = 3, std430) readonly buffer r4_buf { ELEM4 res4[]; };

#if defined(POST_LN)
layout(constant_id = 5) const bool LN_BIAS = true;  // the LayerNorm has a bias
layout(set = 0, binding = 4, std430) readonly buffer w_buf { ELEM4 lnw[]; };   // LayerNorm scale [N4] then bias [N4]
layout(set = 0, binding = 5, std430) writeonly buffer y_buf { ELEM4 y4[]; };   // the GEMM's output
const int REG = 4;   // (the mean's sum below is written out for 4)
const float PIVOT_MAX = 5.0706024e30;   // 2^102, as in layer_norm.comp
layout(push_constant) uniform Params {
  ivec4 dims;   // M, N4, rows per work group, S
  vec4 eps;
} p;
#else
layout(push_constant) uniform Params {
  ivec4 dims;   // M, N, N4, S
} p;
#endif

#include "activation.glslh"

#if defined(POST_LN)
// Element group of the GEMM's output from its summed partials, bias and residual, as the plain variant computes it.
vec4 row_value(vec4 v, vec4 bias, vec4 r) {
  v += bias;
  v = vec4(activate(v.x), activate(v.y), activate(v.z), activate(v.w));
  return activate_res4(v + (HAS_RES ? r : vec4(0.0)));
}

// Up to FAST_S splits, every partial of the lane's share of the row is loaded before any is added (predicated loads,
// no loop-carried wait), so the row costs one memory round trip instead of one per split and element group; the sums
// still run in split order. More splits take the loop.
const int FAST_S = 4;

// The LayerNorm is layer_norm_rows.comp's register path: two passes over the row less its first element (here taken
// from lane 0, which holds it, instead of computed again by every lane), huge values as in layer_norm.comp.
void main() {
  const int M = p.dims.x, L4 = p.dims.y, S = p.dims.w;
  const float inv_len = 1.0 / float(4 * L4);
  const int lane = int(gl_SubgroupInvocationID), width = int(gl_SubgroupSize);
  for (int rr = int(gl_SubgroupID); rr < p.dims.z; rr += int(gl_NumSubgroups)) {
    const int row = int(gl_WorkGroupID.y) * p.dims.z + rr;
    if (row >= M) break;                  // uniform per subgroup: no barriers here
    const int base = row * L4;
    // everything else the row needs, loaded with the partials: one memory round trip, not one per use
    vec4 bias[REG], r[REG], lw[REG], lb[REG];
    [[unroll]] for (int j = 0; j < REG; ++j) {
      const int i = min(lane + j * width, L4 - 1);     // (lanes past the row load a valid element, unused)
      bias[j] = W4(bias4, i);
      r[j] = HAS_RES ? vec4(res4[base + i]) : vec4(0.0);
      lw[j] = W4(lnw, i);
      lb[j] = LN_BIAS ? W4(lnw, L4 + i) : vec4(0.0);
    }
    vec4 v[REG];
    if (S <= FAST_S) {
      vec4 t[FAST_S][REG];
      [[unroll]] for (int s = 0; s < FAST_S; ++s)
        [[unroll]] for (int j = 0; j < REG; ++j) {
          const int i = lane + j * width;
          t[s][j] = s < S && i < L4 ? part4[(s * M + row) * L4 + i] : vec4(0.0);
        }
      [[unroll]] for (int j = 0; j < REG; ++j) {
        v[j] = t[0][j];
        [[unroll]] for (int s = 1; s < FAST_S; ++s)
          if (s < S) v[j] += t[s][j];
      }
    } else {
      [[unroll]] for (int j = 0; j < REG; ++j) {
        const int i = lane + j * width;
        v[j] = vec4(0.0);
        if (i < L4) {
          v[j] = part4[row * L4 + i];
          for (int s = 1; s < S; ++s) v[j] += part4[(s * M + row) * L4 + i];
        }
      }
    }
    [[unroll]] for (int j = 0; j < REG; ++j) {
      const int i = lane + j * width;
      if (i < L4) {
        v[j] = row_value(v[j], bias[j], r[j]);
        y4[base + i] = to_elem4(v[j]);
      }
    }
    float pivot = subgroupBroadcastFirst(v[0].x);   // the row's first element (lane 0 is active)
    if (abs(pivot) >= PIVOT_MAX) pivot = 0.0;
    [[unroll]] for (int j = 0; j < REG; ++j) v[j] = lane + j * width < L4 ? v[j] - pivot : vec4(0.0);
    // one `precise` expression, not a loop, for REG = 4: as in layer_norm_rows.comp
    precise vec4 s = (v[0] * inv_len + v[1] * inv_len) + (v[2] * inv_len + v[3] * inv_len);
    precise float h = s.x + s.y + s.z + s.w;
    const float shift = subgroupAdd(h);
    vec4 q = vec4(0.0);
    [[unroll]] for (int j = 0; j < REG; ++j) {
      const vec4 d = v[j] - shift;
      q += lane + j * width < L4 ? d * d : vec4(0.0);
    }
    const float rstd = inversesqrt(subgroupAdd(q.x + q.y + q.z + q.w) * inv_len + p.eps.x);
    [[unroll]] for (int j = 0; j < REG; ++j) {
      const int i = lane + j * width;
      if (i >= L4) break;
      vec4 z = (rstd == 0.0 ? vec4(0.0) : (v[j] - shift) * rstd) * lw[j];
      if (LN_BIAS) z += lb[j];
      o4[base + i] = to_out4(z);
    }
  }
}
#else
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
    o4[idx >> 2] = to_out4(activate_res4(v + (HAS_RES ? vec4(res4[idx >> 2]) : vec4(0.0))));
  } else {
    [[unroll]] for (int l = 0; l < 4; ++l)
      if (l < rem) o[idx + l] = to_out(activate_res(v[l] + (HAS_RES ? float(res[idx + l]) : 0.0)));
  }
}
#endif
