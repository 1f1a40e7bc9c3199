#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: dtype=float,half
// A Linear of a few rows (M <= MAX_ROWS: a decoder step, one token a beam): out = act(A[M, K] @ B[K, N] + bias)
// (+ residual), A row-major with K a multiple of 4, B prepacked as [K][N4] vec4 (as glsl/linear.comp reads it). With
// so few rows the work is reading B once, and a tiled GEMM would leave most of the GPU idle (N / 16 groups); here a
// work group of LX x LY invocations takes LX vec4 columns, each column's K split over the LY invocations of ty
// (lane ty sums k4 = ty, ty + LY, ...: each k row's LX vec4 are one contiguous read), and a shared-memory tree adds
// the LY sums in a fixed order (the same bits every run).
#include "common.glslh"

layout(constant_id = 3) const int ACT = 0;          // ACT_* of activation.glslh
layout(constant_id = 4) const bool HAS_RES = false; // + residual[m, n]

const int MAX_ROWS = 8;

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM o[]; };
layout(set = 0, binding = 1, std430) readonly buffer a_buf { ELEM4 a4[]; };
layout(set = 0, binding = 2, std430) readonly buffer b_buf { ELEM4 b4[]; };
layout(set = 0, binding = 3, std430) readonly buffer bias_buf { ELEM4 bias4[]; };
layout(set = 0, binding = 4, std430) readonly buffer r_buf { ELEM res[]; };

layout(push_constant) uniform Params {
  ivec4 dims;   // M, N, K, N4
  ivec4 geo;    // NP: 0 for a row-major out [M, N], else the part width of a part-major out [N / NP][M][NP] (sibling
                // Linears merged into one by the merge_siblings pass, as linear.comp's OUT_MODE 2)
} p;

const int LX = int(gl_WorkGroupSize.x);
const int LY = int(gl_WorkGroupSize.y);   // a power of two

shared vec4 red_sh[LX * LY];

#include "activation.glslh"

void main() {
  const int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
  const int M = p.dims.x, N = p.dims.y, K4 = p.dims.z / 4, N4 = p.dims.w;
  const int n4 = int(gl_WorkGroupID.x) * LX + tx;
  vec4 acc[MAX_ROWS];
  [[unroll]] for (int m = 0; m < MAX_ROWS; ++m) acc[m] = vec4(0.0);
  if (n4 < N4) {
    for (int k4 = ty; k4 < K4; k4 += LY) {
      const int kb = 4 * k4 * N4 + n4;
      const vec4 w0 = W4(b4, kb), w1 = W4(b4, kb + N4), w2 = W4(b4, kb + 2 * N4), w3 = W4(b4, kb + 3 * N4);
      [[unroll]] for (int m = 0; m < MAX_ROWS; ++m) {
        if (m < M) {
          const vec4 x = vec4(a4[m * K4 + k4]);
          acc[m] += x.x * w0 + x.y * w1 + x.z * w2 + x.w * w3;
        }
      }
    }
  }
  const int tid = ty * LX + tx;
  [[unroll]] for (int m = 0; m < MAX_ROWS; ++m) {
    if (m < M) {                                  // M is uniform: every invocation takes the same rows
      red_sh[tid] = acc[m];
      for (int s = LY >> 1; s > 0; s >>= 1) {
        barrier();
        if (ty < s) red_sh[tid] += red_sh[tid + s * LX];
      }
      barrier();
      if (ty == 0 && n4 < N4) {
        vec4 v = red_sh[tx] + W4(bias4, n4);
        v = vec4(activate(v.x), activate(v.y), activate(v.z), activate(v.w));
        const int n = n4 * 4, rem = min(N - n, 4);
        [[unroll]] for (int l = 0; l < 4; ++l) {
          if (l < rem) {
            const int c = n + l, np = p.geo.x;
            const int idx = np > 0 ? ((c / np) * M + m) * np + c % np : m * N + c;
            o[idx] = to_elem(v[l] + (HAS_RES ? float(res[idx]) : 0.0));
          }
        }
      }
      barrier();                                  // red_sh is rewritten for the next row
    }
  }
}
