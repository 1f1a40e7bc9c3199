#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: w=float,i8,q4 dtype=float,half
// A Linear of a few rows (M <= MAX_ROWS: a decoder step, one token a beam): out = act(A[M, K] @ B[K, N] + bias)
// (+ residual), A row-major with K a multiple of 4, B prepacked as [K][N4] vec4 (as glsl/linear.comp reads it). With
// so few rows the work is reading B once, and a tiled GEMM would leave most of the GPU idle (N / 16 groups); here a
// work group of LX x LY invocations takes LX vec4 columns, each column's K split over the LY invocations of ty
// (lane ty sums k4 = ty, ty + LY, ...: each k row's LX vec4 are one contiguous read), and a shared-memory tree adds
// the LY sums in a fixed order (the same bits every run).
// LN (the fuse_norm_linear_rows pass): A's rows are a LayerNorm's input; the group normalises each row as it reads
// it (numerics as glsl/layer_norm_rows.comp: two passes about the row's first element), so the LayerNorm needs no
// dispatch and no output of its own.
// w=i8: B as int8 with a scale and zero point per column (glsl/qweight.glslh, binding 6); the sums are of
// (q - zero) and the scale is applied once per output. w=q4: blockwise 4-bit B, each 4-k group dequantized with its
// block's scale and zero point.
#include "common.glslh"
#include "qweight.glslh"

layout(constant_id = 3) const int ACT = 0;          // ACT_* of activation.glslh
layout(constant_id = 4) const bool HAS_RES = false; // + residual[m, n]
layout(constant_id = 5) const bool LN = false;      // normalise A's rows first (scale [K4] then bias [K4] at binding 5)
layout(constant_id = 6) const bool LN_BIAS = true;  // the LayerNorm has a bias

const int MAX_ROWS = 8;

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM o[]; };
layout(set = 0, binding = 1, std430) readonly buffer a_buf { ELEM4 a4[]; };
#if defined(W_I8)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { uint b4[]; };
layout(set = 0, binding = 6, std430) readonly buffer q_buf { vec4 qsz4[]; };   // scale [N4] then zero [N4]
#define WB(i) (unpack_i8(b4[i]) - zero)
#elif defined(W_Q4)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { uint b4[]; };
layout(set = 0, binding = 6, std430) readonly buffer q_buf { vec4 qsz4[]; };   // header, scale, zero
#define WB(i) ((unpack_u4(b4[(i) >> 1], i) - qz) * qs)
#else
layout(set = 0, binding = 2, std430) readonly buffer b_buf { ELEM4 b4[]; };
#define WB(i) W4(b4, i)
#endif
layout(set = 0, binding = 3, std430) readonly buffer bias_buf { ELEM4 bias4[]; };
layout(set = 0, binding = 4, std430) readonly buffer r_buf { ELEM res[]; };
layout(set = 0, binding = 5, std430) readonly buffer ln_buf { ELEM4 lnw[]; };   // LN: scale [K4] then bias [K4]

layout(push_constant) uniform Params {
  ivec4 dims;   // M, N, K, N4
  ivec4 geo;    // NP: 0 for a row-major out [M, N], else the part width of a part-major out [N / NP][M][NP] (sibling
                // Linears merged into one by the merge_siblings pass, as linear.comp's OUT_MODE 2)
  vec4 ln;      // LN: epsilon
} p;

const int LX = int(gl_WorkGroupSize.x);
const int LY = int(gl_WorkGroupSize.y);   // a power of two
const int LXY = LX * LY;

shared vec4 red_sh[LXY];

#include "activation.glslh"

// The group's sum of v (one vec4 an invocation: four rows' partial sums), in a fixed order, in every invocation.
vec4 group_sum(vec4 v, int tid) {
  red_sh[tid] = v;
  int s = 1;
  while (2 * s < LXY) s *= 2;             // the largest power of two below LXY (LX need not be one)
  for (; s > 0; s >>= 1) {
    barrier();
    if (tid < s && tid + s < LXY) red_sh[tid] += red_sh[tid + s];
  }
  barrier();
  const vec4 r = red_sh[0];
  barrier();                              // red_sh is rewritten next
  return r;
}

void main() {
  const int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
  const int M = p.dims.x, N = p.dims.y, K4 = p.dims.z / 4, N4 = p.dims.w;
  const int n4 = int(gl_WorkGroupID.x) * LX + tx;
  const int tid = ty * LX + tx;
  // LN: each row's pivot (its first element), its mean about the pivot (shift) and 1 / std, four rows a pass (a
  // vec4 of row sums)
  float pivot[MAX_ROWS], shift[MAX_ROWS], rstd[MAX_ROWS];
  if (LN) {
    const float inv_len = 1.0 / float(4 * K4);
    [[unroll]] for (int m0 = 0; m0 < MAX_ROWS; m0 += 4) {
      if (m0 < M) {
        [[unroll]] for (int j = 0; j < 4; ++j) pivot[m0 + j] = m0 + j < M ? float(a4[(m0 + j) * K4].x) : 0.0;
        precise vec4 s = vec4(0.0);
        for (int k4 = tid; k4 < K4; k4 += LXY) {
          [[unroll]] for (int j = 0; j < 4; ++j) {
            if (m0 + j < M) {
              precise vec4 d = (vec4(a4[(m0 + j) * K4 + k4]) - pivot[m0 + j]) * inv_len;
              s[j] += (d.x + d.y) + (d.z + d.w);
            }
          }
        }
        const vec4 mean = group_sum(s, tid);
        vec4 q = vec4(0.0);
        for (int k4 = tid; k4 < K4; k4 += LXY) {
          [[unroll]] for (int j = 0; j < 4; ++j) {
            if (m0 + j < M) {
              const vec4 d = (vec4(a4[(m0 + j) * K4 + k4]) - pivot[m0 + j]) - mean[j];
              q[j] += dot(d, d);
            }
          }
        }
        const vec4 var = group_sum(q, tid) * inv_len;
        [[unroll]] for (int j = 0; j < 4; ++j) {
          shift[m0 + j] = mean[j];
          rstd[m0 + j] = inversesqrt(var[j] + p.ln.x);
        }
      }
    }
  }
  vec4 acc[MAX_ROWS];
  [[unroll]] for (int m = 0; m < MAX_ROWS; ++m) acc[m] = vec4(0.0);
  if (n4 < N4) {
#if defined(W_I8)
    const vec4 zero = qsz4[N4 + n4];
#endif
    for (int k4 = ty; k4 < K4; k4 += LY) {
      const int kb = 4 * k4 * N4 + n4;
#if defined(W_Q4)
      const int blk = (4 * k4) / int(qsz4[0].x), nblk = int(qsz4[0].y);
      const vec4 qs = qsz4[1 + blk * N4 + n4], qz = qsz4[1 + (nblk + blk) * N4 + n4];
#endif
      const vec4 w0 = WB(kb), w1 = WB(kb + N4), w2 = WB(kb + 2 * N4), w3 = WB(kb + 3 * N4);
      const vec4 g = LN ? W4(lnw, k4) : vec4(1.0), beta = LN && LN_BIAS ? W4(lnw, K4 + k4) : vec4(0.0);
      [[unroll]] for (int m = 0; m < MAX_ROWS; ++m) {
        if (m < M) {
          vec4 x = vec4(a4[m * K4 + k4]);
          if (LN) x = (rstd[m] == 0.0 ? vec4(0.0) : ((x - pivot[m]) - shift[m]) * rstd[m]) * g + beta;
          acc[m] += x.x * w0 + x.y * w1 + x.z * w2 + x.w * w3;
        }
      }
    }
  }
  [[unroll]] for (int m = 0; m < MAX_ROWS; ++m) {
    if (m < M) {                                  // M is uniform: every invocation takes the same rows
      red_sh[tid] = acc[m];
      for (int s = LY >> 1; s > 0; s >>= 1) {
        barrier();
        if (ty < s) red_sh[tid] += red_sh[tid + s * LX];
      }
      barrier();
      if (ty == 0 && n4 < N4) {
#if defined(W_I8)
        vec4 v = red_sh[tx] * qsz4[n4] + W4(bias4, n4);
#else
        vec4 v = red_sh[tx] + W4(bias4, n4);
#endif
        v = vec4(activate(v.x), activate(v.y), activate(v.z), activate(v.w));
        const int n = n4 * 4, rem = min(N - n, 4);
        [[unroll]] for (int l = 0; l < 4; ++l) {
          if (l < rem) {
            const int c = n + l, np = p.geo.x;
            const int idx = np > 0 ? ((c / np) * M + m) * np + c % np : m * N + c;
            o[idx] = to_elem(activate_res(v[l] + (HAS_RES ? float(res[idx]) : 0.0)));
          }
        }
      }
      barrier();                                  // red_sh is rewritten for the next row
    }
  }
}
