#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: w=float,i8,q4 dtype=float,half
// A Linear of a few rows (M <= 32: a decoder step, one token a beam or a clip): out = act(A[M, K] @ B[K, N] + bias)
// (+ residual), A row-major with K a multiple of 4, B prepacked as [K][N4] (as glsl/linear.comp reads it: a vec4
// column group a k row, 16, 8, 4 or 2 bytes by the weight type). With so few rows the work is reading B once, and the
// time is the memory system's: a work group of LX x LY invocations takes LX CV vec4 columns; lane tx holds columns
// tx, tx + LX, ... (CV of them, so each load is LX consecutive column groups of one k row across the lanes; VEC:
// columns tx CV .. tx CV + CV - 1, read 16 bytes a load) for all ROWS rows, and reads a contiguous run of the k rows
// of its split (ty's share of the group's k4 rows). Every weight and activation load of UNROLL vec4 rows of K is
// issued before their FMAs, so a lane keeps 4 UNROLL CV loads in flight. The LY partial sums of a column are then
// added in ty order through shared memory (the same bits every run).
// SPLIT (the planner splits K where the column groups alone leave most of the GPU idle): the gl_NumWorkGroups.z
// groups of a column group each take p.geo.z vec4 rows of K and write fp32 partials [S][M][N4] (binding 0) that
// glsl/linear_reduce.comp adds in split order with the bias, activation and residual.
// LN (the fuse_norm_linear_rows pass): A's rows are a LayerNorm's input; the group normalises each row as it reads
// it (numerics as glsl/layer_norm_rows.comp: two passes about the row's first element), so the LayerNorm needs no
// dispatch and no output of its own.
// Past REG_ROWS rows (a batched step, one token a clip) the registers go to the accumulators (the planner gives a lane
// one vec4 column there): a step loads its weights first and then each row's activations just before that row's
// FMAs, the LayerNorm's statistics live in shared memory, and 4-bit weights are scaled as they are loaded (four
// operations a weight, shared by all the rows) instead of through block sums a row.
// w=i8: B as int8 with a scale and zero point per column (glsl/qweight.glslh, binding 6); the sums are of
// (q - zero) and the scale is applied once per output. w=q4: blockwise 4-bit B; a lane loads a block's scales and
// zero points once for its columns as its run enters the block, sums a q and a over the block, and adds
// scale (sum(a q) - zero sum(a)) to the output's sum as it leaves it: two operations a weight past the load and the
// FMA's, where (q - zero) * scale would take four.
#include "common.glslh"
#include "qweight.glslh"

layout(constant_id = 3) const int ACT = 0;          // ACT_* of activation.glslh
layout(constant_id = 4) const bool HAS_RES = false; // + residual[m, n]
layout(constant_id = 5) const bool LN = false;      // normalise A's rows first (scale [K4] then bias [K4] at binding 5)
layout(constant_id = 6) const bool LN_BIAS = true;  // the LayerNorm has a bias
layout(constant_id = 7) const int ROWS = 8;         // M (<= 32), constant: the accumulators are registers
layout(constant_id = 8) const int CV = 1;           // vec4 columns a lane
layout(constant_id = 9) const bool SPLIT = false;   // write fp32 partials of the group's split of K
layout(constant_id = 10) const bool VEC = false;    // a lane's columns adjacent, VPL of them a vector load (N4 and CV
                                                    // multiples of VPL): one 16-byte load (w=q4: 8) for VPL columns

const int REG_ROWS = 8;                              // rows whose activations, LN statistics and 4-bit block sums
const bool FEW = ROWS <= REG_ROWS;                   // a step keeps in registers
const int UNROLL = 2;                                // vec4 rows of K loaded before their FMAs

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM o[]; };
layout(set = 0, binding = 0, std430) writeonly buffer p_buf { vec4 part4[]; };   // SPLIT: [S][M][N4]
layout(set = 0, binding = 1, std430) readonly buffer a_buf { ELEM4 a4[]; };
// VEC's vector loads: VPL vec4 column groups each, 16 bytes (w=q4: 8) or, where a lane has only 2 columns, 8 (w=q4: 4)
layout(set = 0, binding = 2, std430) readonly buffer bv_buf { uvec4 bv[]; };
layout(set = 0, binding = 2, std430) readonly buffer bv2_buf { uvec2 bv2[]; };
#if defined(W_Q4) || defined(W_I8)
const int VPL = CV < 4 ? CV : 4;
#elif defined(DTYPE_HALF)
const int VPL = CV < 2 ? CV : 2;
#else
const int VPL = 1;
#endif
#if defined(W_I8)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { uint b4[]; };
layout(set = 0, binding = 6, std430) readonly buffer q_buf { vec4 qsz4[]; };   // scale [N4] then zero [N4]
#define WB(i, j) (unpack_i8_bits(b4[i]) - qz[j])
#elif defined(W_Q4)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { uint b4[]; };
layout(set = 0, binding = 6, std430) readonly buffer q_buf { vec4 qsz4[]; };   // header, scale, zero
#define WB(i, j) unpack_u4_bits(b4[(i) >> 1], i)
#else
layout(set = 0, binding = 2, std430) readonly buffer b_buf { ELEM4 b4[]; };
#define WB(i, j) W4(b4, i)
#endif
layout(set = 0, binding = 3, std430) readonly buffer bias_buf { ELEM4 bias4[]; };
layout(set = 0, binding = 4, std430) readonly buffer r_buf { ELEM res[]; };
layout(set = 0, binding = 5, std430) readonly buffer ln_buf { ELEM4 lnw[]; };   // LN: scale [K4] then bias [K4]

layout(push_constant) uniform Params {
  ivec4 dims;   // M (as ROWS), N, K, N4
  ivec4 geo;    // NP: 0 for a row-major out [M, N], else the part width of a part-major out [N / NP][M][NP] (sibling
                // Linears merged into one by the merge_siblings pass, as linear.comp's OUT_MODE 2); S (K splits);
                // vec4 rows of K a split
  vec4 ln;      // LN: epsilon
} p;

const int LX = int(gl_WorkGroupSize.x);
const int LY = int(gl_WorkGroupSize.y);
const int LXY = LX * LY;
const int OUTS = LX * CV;                           // the group's vec4 columns
const int SEGS = LY < 8 ? LY : 8;                   // the ty sums' first step: runs of SEG_LEN
const int SEG_LEN = (LY + SEGS - 1) / SEGS;

shared vec4 red_sh[LXY * CV];
shared float ln_sh[3 * ROWS];                       // LN past REG_ROWS: pivots, shifts, 1 / std of the rows

#include "activation.glslh"

vec4 acc[ROWS * CV];                                // row m, column j at m CV + j
int col[CV];                                        // the lane's vec4 columns (clamped into B: see main)
float pivot[ROWS], shift[ROWS], rstd[ROWS];         // LN (FEW)
vec4 qs[CV], qz[CV];                                // w=i8: zero points; w=q4: the current block's scales, zero points
#if defined(W_Q4)
vec4 bacc[ROWS * CV];                               // w=q4 (FEW): the current block's sums of a q
float asum[ROWS];                                   // w=q4 (FEW): the current block's sums of a, a row
#define ACC bacc
#else
#define ACC acc
#endif

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

// Row m's activations at vec4 row k4 of K (LN: normalised; g, beta: the LayerNorm's scale and bias there).
vec4 a_row(const int m, const int k4, const vec4 g, const vec4 beta) {
  const int K4 = p.dims.z / 4;
  vec4 a = vec4(a4[m * K4 + k4]);
  if (LN) {
    const float pv = FEW ? pivot[m] : ln_sh[m], sh = FEW ? shift[m] : ln_sh[ROWS + m];
    const float rs = FEW ? rstd[m] : ln_sh[2 * ROWS + m];
    a = (rs == 0.0 ? vec4(0.0) : ((a - pv) - sh) * rs) * g + beta;
  }
  return a;
}

// The products of U (1 or UNROLL) vec4 rows of K from k4 on: all their weight loads (FEW: and activation loads), then
// the FMAs.
void rows_k4(const int k4, const int U) {
  const int M = ROWS, K4 = p.dims.z / 4, N4 = p.dims.w;
  vec4 w[UNROLL * 4 * CV];
  vec4 x[UNROLL * ROWS];
  [[unroll]] for (int u = 0; u < UNROLL; ++u) {
    if (u < U) {
      [[unroll]] for (int r = 0; r < 4; ++r) {
        if (VEC) {
          [[unroll]] for (int v = 0; v < CV / VPL; ++v) {
            const int jv = v * VPL, i = ((4 * (k4 + u) + r) * N4 + col[jv]) / VPL, b = (u * 4 + r) * CV + jv;
#if defined(W_Q4)
            if (VPL == 4) {
              const uvec2 q = bv2[i];
              [[unroll]] for (int e = 0; e < 4; ++e) w[b + e] = unpack_u4_bits(q[e >> 1], e);
            } else {
              const uint q = b4[i];
              [[unroll]] for (int e = 0; e < 2; ++e) w[b + e] = unpack_u4_bits(q, e);
            }
#elif defined(W_I8)
            if (VPL == 4) {
              const uvec4 q = bv[i];
              [[unroll]] for (int e = 0; e < 4; ++e) w[b + e] = unpack_i8_bits(q[e]) - qz[jv + e];
            } else {
              const uvec2 q = bv2[i];
              [[unroll]] for (int e = 0; e < 2; ++e) w[b + e] = unpack_i8_bits(q[e]) - qz[jv + e];
            }
#elif defined(DTYPE_HALF)
            const uvec4 q = bv[i];
            w[b] = vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
            w[b + 1] = vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w));
#else
            w[b] = uintBitsToFloat(bv[i]);
#endif
          }
        } else {
          [[unroll]] for (int j = 0; j < CV; ++j) w[(u * 4 + r) * CV + j] = WB((4 * (k4 + u) + r) * N4 + col[j], j);
        }
      }
#if defined(W_Q4)
      if (!FEW) {
        [[unroll]] for (int r = 0; r < 4; ++r) {
          [[unroll]] for (int j = 0; j < CV; ++j) w[(u * 4 + r) * CV + j] = (w[(u * 4 + r) * CV + j] - qz[j]) * qs[j];
        }
      }
#endif
      if (FEW) {
        const vec4 g = LN ? W4(lnw, k4 + u) : vec4(1.0), beta = LN && LN_BIAS ? W4(lnw, K4 + k4 + u) : vec4(0.0);
        [[unroll]] for (int m = 0; m < ROWS; ++m) {
          if (m < M) {
            const vec4 a = a_row(m, k4 + u, g, beta);
            x[u * ROWS + m] = a;
#if defined(W_Q4)
            asum[m] += (a.x + a.y) + (a.z + a.w);
#endif
          }
        }
      }
    }
  }
  [[unroll]] for (int u = 0; u < UNROLL; ++u) {
    if (u < U) {
      const vec4 g = LN ? W4(lnw, k4 + u) : vec4(1.0), beta = LN && LN_BIAS ? W4(lnw, K4 + k4 + u) : vec4(0.0);
      [[unroll]] for (int m = 0; m < ROWS; ++m) {
        if (m < M) {
          const vec4 a = FEW ? x[u * ROWS + m] : a_row(m, k4 + u, g, beta);
          [[unroll]] for (int j = 0; j < CV; ++j) {
            const int b = u * 4 * CV + j;
            const vec4 d = a.x * w[b] + a.y * w[b + CV] + a.z * w[b + 2 * CV] + a.w * w[b + 3 * CV];
            if (FEW) ACC[m * CV + j] += d;
            else acc[m * CV + j] += d;       // w=q4: scaled as loaded
          }
        }
      }
    }
  }
}

// Output vec4 column n4 of row m from its summed products s.
void store(int m, int n4, vec4 s) {
  const int M = ROWS, N = p.dims.y, N4 = p.dims.w;
#if defined(W_I8)
  s *= qsz4[n4];
#endif
  if (SPLIT) {
    part4[(int(gl_WorkGroupID.z) * M + m) * N4 + n4] = s;
    return;
  }
  vec4 v = s + W4(bias4, n4);
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

void main() {
  const int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
  const int M = ROWS, K4 = p.dims.z / 4, N4 = p.dims.w;
  const int tid = ty * LX + tx, first = int(gl_WorkGroupID.x) * OUTS;
  // the split's vec4 rows of K and ty's contiguous run of them
  const int kz = int(gl_WorkGroupID.z) * p.geo.z, kz_end = min(K4, kz + p.geo.z);
  const int run = (kz_end - kz + LY - 1) / LY;
  const int k_beg = min(kz_end, kz + ty * run), k_end = min(kz_end, k_beg + run);
  // LN: each row's pivot (its first element), its mean about the pivot (shift) and 1 / std, four rows a pass (a
  // vec4 of row sums)
  if (LN) {
    const float inv_len = 1.0 / float(4 * K4);
    [[unroll]] for (int m0 = 0; m0 < ROWS; m0 += 4) {
      if (m0 < M) {
        vec4 pv = vec4(0.0);
        [[unroll]] for (int j = 0; j < 4; ++j) {
          if (m0 + j < M) pv[j] = float(a4[(m0 + j) * K4].x);
        }
        precise vec4 s = vec4(0.0);
        for (int k4 = tid; k4 < K4; k4 += LXY) {
          [[unroll]] for (int j = 0; j < 4; ++j) {
            if (m0 + j < M) {
              precise vec4 d = (vec4(a4[(m0 + j) * K4 + k4]) - pv[j]) * inv_len;
              s[j] += (d.x + d.y) + (d.z + d.w);
            }
          }
        }
        const vec4 mean = group_sum(s, tid);
        vec4 q = vec4(0.0);
        for (int k4 = tid; k4 < K4; k4 += LXY) {
          [[unroll]] for (int j = 0; j < 4; ++j) {
            if (m0 + j < M) {
              const vec4 d = (vec4(a4[(m0 + j) * K4 + k4]) - pv[j]) - mean[j];
              q[j] += dot(d, d);
            }
          }
        }
        const vec4 var = group_sum(q, tid) * inv_len;
        [[unroll]] for (int j = 0; j < 4; ++j) {
          if (m0 + j < ROWS) {
            const float rs = inversesqrt(var[j] + p.ln.x);
            if (FEW) {
              pivot[m0 + j] = pv[j];
              shift[m0 + j] = mean[j];
              rstd[m0 + j] = rs;
            } else if (tid == 0) {
              ln_sh[m0 + j] = pv[j];
              ln_sh[ROWS + m0 + j] = mean[j];
              ln_sh[2 * ROWS + m0 + j] = rs;
            }
          }
        }
      }
    }
    if (!FEW) barrier();                          // ln_sh read by every invocation from here
  }
  // lanes past N4 read a valid column (the last) and store nothing: no branch around the loads
  // (VEC: each vector load's columns together, the last whole vector's where they pass N4)
  [[unroll]] for (int j = 0; j < CV; ++j) {
    col[j] = VEC ? min(first + tx * CV + j - j % VPL, N4 - VPL) + j % VPL : min(first + j * LX + tx, N4 - 1);
  }
  [[unroll]] for (int i = 0; i < ROWS * CV; ++i) acc[i] = vec4(0.0);
#if defined(W_I8)
  [[unroll]] for (int j = 0; j < CV; ++j) qz[j] = qsz4[N4 + col[j]];
#endif
#if defined(W_Q4)
  const int blk_k4 = int(qsz4[0].x) / 4, nblk = int(qsz4[0].y);
  for (int k4 = k_beg; k4 < k_end;) {
    const int blk = k4 / blk_k4, end = min(k_end, (blk + 1) * blk_k4);
    [[unroll]] for (int j = 0; j < CV; ++j) {
      qs[j] = qsz4[1 + blk * N4 + col[j]];
      qz[j] = qsz4[1 + (nblk + blk) * N4 + col[j]];
    }
    if (FEW) {
      [[unroll]] for (int i = 0; i < ROWS * CV; ++i) bacc[i] = vec4(0.0);
      [[unroll]] for (int m = 0; m < ROWS; ++m) asum[m] = 0.0;
    }
    for (; k4 + UNROLL <= end; k4 += UNROLL) rows_k4(k4, UNROLL);
    for (; k4 < end; ++k4) rows_k4(k4, 1);
    if (FEW) {
      [[unroll]] for (int m = 0; m < ROWS; ++m) {
        [[unroll]] for (int j = 0; j < CV; ++j) acc[m * CV + j] += (bacc[m * CV + j] - qz[j] * asum[m]) * qs[j];
      }
    }
  }
#else
  int k4 = k_beg;
  for (; k4 + UNROLL <= k_end; k4 += UNROLL) rows_k4(k4, UNROLL);
  for (; k4 < k_end; ++k4) rows_k4(k4, 1);
#endif
  // each row: the LY partial sums of the group's column c (lane c % LX's column c / LX) at red_sh[ty OUTS + c],
  // added in ty order in two steps (short dependent chains): SEGS runs of SEG_LEN, each summed into its first entry,
  // then those in order
  [[unroll]] for (int m = 0; m < ROWS; ++m) {
    [[unroll]] for (int j = 0; j < CV; ++j) red_sh[ty * OUTS + (VEC ? tx * CV + j : j * LX + tx)] = acc[m * CV + j];
    barrier();
    for (int t = tid; t < OUTS * SEGS; t += LXY) {
      const int c = t % OUTS, y0 = (t / OUTS) * SEG_LEN, y1 = min(LY, y0 + SEG_LEN);
      if (y0 < y1) {
        vec4 s = red_sh[y0 * OUTS + c];
        for (int y = y0 + 1; y < y1; ++y) s += red_sh[y * OUTS + c];
        red_sh[y0 * OUTS + c] = s;                // only this invocation reads the run's entries
      }
    }
    barrier();
    for (int c = tid; c < OUTS; c += LXY) {
      vec4 s = red_sh[c];
      for (int y = SEG_LEN; y < LY; y += SEG_LEN) s += red_sh[y * OUTS + c];
      if (first + c < N4) store(m, first + c, s);
    }
    barrier();                                    // red_sh is rewritten for the next row
  }
}
