#version 450
// variants: dtype=half
// linear_cm.comp's GEMM (same bindings, push constants, specialization constants and epilogue) with every matrix
// fragment loaded by coopMatLoad straight from the storage buffers: no shared-memory staging and no work-group
// barriers; the L1 cache shares A rows between the subgroups of a block and B columns between blocks. Each of the
// 4 subgroups computes a 32 x 32 part (2 x 2 accumulators of 16 x 16) of a 64 x 64 block. Needs K and N multiples
// of 16 and M >= 16 (minirt/ops/gemm.py checks): a row tile that would pass M is moved up to end at row M, and
// only its rows from the tile's own start are stored, so no load leaves the A rows of this dispatch.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glslh"

#define BM 64
#define BN 64
#define WM 2
#define WN 2
#define FM 2
#define FN 2
#define CS 20

layout(constant_id = 3) const int OUT_MODE = 0;
layout(constant_id = 4) const int ACT = 0;
layout(constant_id = 5) const bool HAS_RES = false;

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { float16_t o[]; };
layout(set = 0, binding = 1, std430) readonly buffer a_buf { float16_t a[]; };
layout(set = 0, binding = 2, std430) readonly buffer b_buf { float16_t bw[]; };
layout(set = 0, binding = 3, std430) readonly buffer bias_buf { f16vec4 bias4[]; };
layout(set = 0, binding = 4, std430) readonly buffer r_buf { float16_t res[]; };

layout(push_constant) uniform Params {
  ivec4 dims;   // M (rows of this dispatch), N, K, N4
  ivec4 geo;    // M0, LDA4, M_total (OUT_MODE 1, 2), NP (OUT_MODE 2)
} p;

shared float c_sh[WM * WN * 16 * CS];

float activate(float x) {
  if (ACT == 1) return relu_f(x);
  if (ACT == 2) return 0.5 * x * (1.0 + erf_f(x * 0.70710678118654752));
  if (ACT == 3) return 0.5 * x * (1.0 + tanh_f(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  return x;
}

void main() {
  const int warp = int(gl_SubgroupID), lane = int(gl_SubgroupInvocationID), sg = int(gl_SubgroupSize);
  const int wm = warp / WN, wn = warp % WN;
  const int M = p.dims.x, N = p.dims.y, K = p.dims.z, LDA = p.geo.y * 4, LDB = p.dims.w * 4;
  const int m_base = int(gl_WorkGroupID.y) * BM + wm * (BM / WM);
  const int n_base = int(gl_WorkGroupID.z) * BN + wn * (BN / WN);

  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[FM * FN];
  [[unroll]] for (int i = 0; i < FM * FN; ++i)
    acc[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
  int rows[FM];      // the first row each row tile loads (moved up to end at M)
  [[unroll]] for (int i = 0; i < FM; ++i) rows[i] = min(m_base + i * 16, M - 16);
  const bool live = m_base < M && n_base < N;   // uniform in the subgroup

  if (live) {
    for (int k = 0; k < K; k += 16) {
      coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> fa[FM];
      [[unroll]] for (int i = 0; i < FM; ++i)
        coopMatLoad(fa[i], a, uint(rows[i] * LDA + k), uint(LDA), gl_CooperativeMatrixLayoutRowMajor);
      [[unroll]] for (int j = 0; j < FN; ++j) {
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> fb;
        coopMatLoad(fb, bw, uint(k * LDB + min(n_base + j * 16, N - 16)), uint(LDB),
                    gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (int i = 0; i < FM; ++i) acc[i * FN + j] = coopMatMulAdd(fa[i], fb, acc[i * FN + j]);
      }
    }
  }

  const uint cbase = uint(warp * 16 * CS);
  [[unroll]] for (int i = 0; i < FM; ++i)
    [[unroll]] for (int j = 0; j < FN; ++j) {
      const int own = m_base + i * 16, n0 = n_base + j * 16;   // rows own .. own + 15 belong to this tile
      if (!live || own >= M || n0 >= N) continue;
      const int m0 = rows[i];                                 // ... computed from row m0 on
      coopMatStore(acc[i * FN + j], c_sh, cbase, uint(CS), gl_CooperativeMatrixLayoutRowMajor);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      for (int e = lane; e < 256; e += sg) {
        const int r = OUT_MODE != 1 ? e >> 4 : e & 15, c = OUT_MODE != 1 ? e & 15 : e >> 4;
        const int m = m0 + r, n = n0 + c;
        if (m < own || m >= M || n >= N) continue;
        float v = activate(c_sh[cbase + uint(r * CS + c)] + float(bias4[n >> 2][n & 3]));
        if (OUT_MODE == 1) {
          o[n * p.geo.z + p.geo.x + m] = to_elem(v);
        } else {
          int idx = (p.geo.x + m) * N + n;
          if (OUT_MODE == 2) {
            const int part = n / p.geo.w;
            idx = (part * p.geo.z + p.geo.x + m) * p.geo.w + (n - part * p.geo.w);
          }
          o[idx] = to_elem(v + (HAS_RES ? float(res[idx]) : 0.0));
        }
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();
    }
}
