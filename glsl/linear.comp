#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: tile=t44,t44k32 w=float,i8,q4 dtype=float,half io=elem,out32
// exclude: dtype=float io=out32
// Fast fp32 GEMM for buffers: out = act(A[M, K] @ B[K, N] + bias) (+ residual), A row-major with K a
// multiple of 4 (rows read as vec4), B a weight prepacked as [K][N4] vec4. A work group computes a
// BM x BN block (BM = local y * TM, BN = local x * 4 * TN4); each BK-deep slice of A and B is staged
// in shared memory while the next slice is already being fetched into registers. A is staged row-major
// (one vec4 store per fetched vec4, no bank conflicts); each invocation owns TM rows (groups of 4 at
// ty + g * LY) by TN4 vec4 columns (tx + g * LX) and per 4 k reads one vec4 of A per row (a broadcast
// within the half-warp) and 4 consecutive-column vec4s of B. Tile sizes are #defines so every loop
// unrolls and the accumulators stay in registers.
//   OUT_MODE 0: out row-major [M, N] (linear layers). OUT_MODE 1: out NCHW [N, M_total] with the
//   dispatch's rows starting at M0 (a conv's output channels by spatial positions). OUT_MODE 2: out
//   part-major [N / NP][M_total][NP] with NP = geo.w (sibling Linears merged into one GEMM by the
//   merge_siblings pass: column n is column n % NP of part n / NP, so each part is contiguous).
//   Each invocation's 4 columns (modes 0, 2) or 4 rows of a column (mode 1) are contiguous, so where they are
//   whole and 4-aligned the epilogue writes them (and reads the residual) as one vector.
//   OUT_MODE 3: split K (rows of a Linear, fp32 only): work group z = s of S = geo.w takes an even share of the K
//   slices and writes its raw fp32 sums to part[s][m][n4] (binding 0 as vec4); linear_reduce.comp adds the S
//   partials in order and applies bias, activation and residual. More, shorter groups where one per output block
//   would leave multiprocessors with one group each.
// io=out32 (fp16): the output is a float32 graph output, written as it is.
// w=i8: B as int8 with a scale and zero point per column (glsl/qweight.glslh, binding 5), dequantized as it is
// fetched, so the shared-memory slices and the loop are the float kernel's. w=q4: blockwise 4-bit B (the same header).
// The epilogue has no `continue` or `break`: written as if-blocks, the unsplit epilogues run 0.3-0.8 us faster a GEMM
// on the H200 (docs/benchmarks.md; glslc unrolls those loops itself, so the SPIR-V is larger), and in bigger tiles
// the jumps made NVIDIA's compiler keep the accumulators in local memory. Write such loops with if-blocks.
#include "common.glslh"
#include "qweight.glslh"

#if defined(TILE_T44)
#define TM 4
#define TN4 1
#define BK 16
#elif defined(TILE_T44K32)
#define TM 4
#define TN4 1
#define BK 32
#else
#error "unknown tile"
#endif
#define TMG (TM / 4)

layout(constant_id = 3) const int OUT_MODE = 0;
layout(constant_id = 4) const int ACT = 0;          // ACT_* of activation.glslh
layout(constant_id = 5) const bool HAS_RES = false; // + residual[m, n] (OUT_MODE 0)
// A_WIN: A's rows overlap in one buffer (a 1-D convolution read channels-last, planner/conv_input_nlc.py): row m starts
// at vec4 m * LDA4 - win.x, and what lies outside vec4 [0, win.y) reads as zero (the convolution's padding).
layout(constant_id = 6) const bool A_WIN = false;
// PAIR_LANES: invocations 2i and 2i + 1 of the group take the same columns (tx) in two adjacent row groups (ty), so
// lanes n and n ^ 1 read the same B vec4 and lanes n and n ^ 2 the same A vec4. NVIDIA's shared memory returns a
// 16-byte load to a warp in 2 passes instead of 4 when lanes pair up like that (B loads otherwise take 4): 16 passes
// instead of 24 per 4 k, one of the limits of the 4 x 4 tile's loop (docs/benchmarks.md, "Paired lanes (NVIDIA)"). Only
// the invocations' roles move: every output is summed as before.
layout(constant_id = 7) const bool PAIR_LANES = false;

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { OUT_ELEM o[]; };
layout(set = 0, binding = 0, std430) writeonly buffer o4_buf { OUT_ELEM4 o4[]; };   // OUT_MODE 1's column runs
layout(set = 0, binding = 0, std430) writeonly buffer part_buf { vec4 part4[]; };  // OUT_MODE 3's partials
layout(set = 0, binding = 1, std430) readonly buffer a_buf { ELEM4 a4[]; };
#if defined(W_I8)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { uint b4[]; };
layout(set = 0, binding = 5, std430) readonly buffer q_buf { vec4 qsz4[]; };   // scale [N4] then zero [N4]
#define WB(i, n4, k) ((unpack_i8(b4[i]) - qsz4[N4 + (n4)]) * qsz4[n4])
#elif defined(W_Q4)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { uint b4[]; };
layout(set = 0, binding = 5, std430) readonly buffer q_buf { vec4 qsz4[]; };   // header, scale, zero
#define WB(i, n4, k) q4_at(i, n4, (k) / int(qsz4[0].x), N4)
vec4 q4_at(int i, int n4, int blk, int N4) {
  return (unpack_u4(b4[i >> 1], i) - qsz4[1 + (int(qsz4[0].y) + blk) * N4 + n4]) * qsz4[1 + blk * N4 + n4];
}
#else
layout(set = 0, binding = 2, std430) readonly buffer b_buf { ELEM4 b4[]; };
#define WB(i, n4, k) W4(b4, i)
#endif
layout(set = 0, binding = 3, std430) readonly buffer bias_buf { ELEM4 bias4[]; };
layout(set = 0, binding = 4, std430) readonly buffer r_buf { ELEM res[]; };
layout(set = 0, binding = 4, std430) readonly buffer r4_buf { ELEM4 res4[]; };

layout(push_constant) uniform Params {
  ivec4 dims;   // M (rows of this dispatch), N, K, N4
  ivec4 geo;    // M0 (first output row), LDA4 (A row stride in vec4), M_total (OUT_MODE 1, 2), NP (OUT_MODE 2)
  ivec4 win;    // A_WIN: row 0's start before the buffer (vec4), the buffer's length (vec4)
} p;

// Index of output (row, column n) in the row-major modes 0 and 2 (also the residual's index).
int out_index(int row, int n) {
  if (OUT_MODE == 2) {
    const int part = n / p.geo.w;
    return (part * p.geo.z + row) * p.geo.w + (n - part * p.geo.w);
  }
  return row * p.dims.y + n;
}

const int LX = int(gl_WorkGroupSize.x);
const int LY = int(gl_WorkGroupSize.y);
const int NT = LX * LY;
const int BM4 = LY * TMG;        // row groups of 4 in a block
const int BN4 = LX * TN4;        // vec4 columns in a block
const int A_LOADS = (BM4 * 4 * (BK / 4) + NT - 1) / NT;   // vec4 loads of A per invocation per slice
const int B_LOADS = (BK * BN4 + NT - 1) / NT;

shared vec4 a_sh[BM4 * 4 * (BK / 4)];  // [m][k4]: row-major, so staging is one conflict-free vec4 store
shared vec4 b_sh[BK * BN4];      // [k][n4]

#include "activation.glslh"

void main() {
  const int tid = int(gl_LocalInvocationIndex);   // staging (coalesced fetches) by the linear index
  int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
  if (PAIR_LANES && (LY & 1) == 0) {   // a bijection on the group while LY is even
    const int r = tid % (2 * LX);
    tx = r >> 1;
    ty = (tid / (2 * LX)) * 2 + (r & 1);
  }
  const int m_base = int(gl_WorkGroupID.y) * BM4 * 4;
  const int n4_base = int(gl_WorkGroupID.x) * BN4;
  const int M = p.dims.x, N4 = p.dims.w;
  // K4: the end of this group's K range (in vec4); k4_beg its start (a whole slice)
  int K4 = p.dims.z >> 2, k4_beg = 0;
  if (OUT_MODE == 3) {
    const int S = p.geo.w, s = int(gl_WorkGroupID.z), nk = (K4 + BK / 4 - 1) / (BK / 4);
    k4_beg = (s * nk / S) * (BK / 4);
    K4 = min(((s + 1) * nk / S) * (BK / 4), K4);
  }

  vec4 acc[TM][TN4];
  [[unroll]] for (int i = 0; i < TM; ++i)
    [[unroll]] for (int j = 0; j < TN4; ++j) acc[i][j] = vec4(0.0);

  vec4 a_reg[A_LOADS];
  vec4 b_reg[B_LOADS];
  // A slice: BM rows x BK/4 vec4; invocation e takes row e / (BK/4), vec4 e % (BK/4) (contiguous per row).
  #define FETCH(k4_0) { \
    [[unroll]] for (int l = 0; l < A_LOADS; ++l) { \
      int e = tid + l * NT; int r = e / (BK / 4), q = e % (BK / 4); int m = m_base + r, k4 = (k4_0) + q; \
      int ai = m * p.geo.y + k4 - (A_WIN ? p.win.x : 0); \
      a_reg[l] = (e < BM4 * 4 * (BK / 4) && m < M && k4 < K4 && (!A_WIN || uint(ai) < uint(p.win.y))) \
          ? vec4(a4[ai]) : vec4(0.0); } \
    [[unroll]] for (int l = 0; l < B_LOADS; ++l) { \
      int e = tid + l * NT; int kk = e / BN4, c = e % BN4; int k = (k4_0) * 4 + kk, n4 = n4_base + c; \
      b_reg[l] = (e < BK * BN4 && k < K4 * 4 && n4 < N4) ? WB(k * N4 + n4, n4, k) : vec4(0.0); } }
  #define STAGE() { \
    [[unroll]] for (int l = 0; l < A_LOADS; ++l) { int e = tid + l * NT; if (e < BM4 * 4 * (BK / 4)) a_sh[e] = a_reg[l]; } \
    [[unroll]] for (int l = 0; l < B_LOADS; ++l) { int e = tid + l * NT; if (e < BK * BN4) b_sh[e] = b_reg[l]; } }

  FETCH(k4_beg)
  for (int k4_0 = k4_beg; k4_0 < K4; k4_0 += BK / 4) {
    STAGE()
    barrier();
    if (k4_0 + BK / 4 < K4) FETCH(k4_0 + BK / 4)   // the next slice travels while this one is used
    [[unroll]] for (int kq = 0; kq < BK / 4; ++kq) {
      vec4 b[4][TN4];   // 4 consecutive k of this invocation's columns
      [[unroll]] for (int c = 0; c < 4; ++c)
        [[unroll]] for (int j = 0; j < TN4; ++j) b[c][j] = b_sh[(kq * 4 + c) * BN4 + tx + j * LX];
      [[unroll]] for (int g = 0; g < TMG; ++g)
        [[unroll]] for (int i = 0; i < 4; ++i) {
          vec4 a = a_sh[((ty + g * LY) * 4 + i) * (BK / 4) + kq];   // 4 consecutive k of one row
          [[unroll]] for (int j = 0; j < TN4; ++j) {   // four dependent FMAs per lane
            acc[g * 4 + i][j] += a.x * b[0][j];
            acc[g * 4 + i][j] += a.y * b[1][j];
            acc[g * 4 + i][j] += a.z * b[2][j];
            acc[g * 4 + i][j] += a.w * b[3][j];
          }
        }
    }
    barrier();
  }

  if (OUT_MODE == 3) {
    const int s = int(gl_WorkGroupID.z);
    [[unroll]] for (int g = 0; g < TMG; ++g)
      [[unroll]] for (int i = 0; i < 4; ++i) {
        const int m = m_base + (ty + g * LY) * 4 + i;
        [[unroll]] for (int j = 0; j < TN4; ++j) {
          const int n4 = n4_base + tx + j * LX;
          if (m < M && n4 < N4) part4[(s * M + m) * N4 + n4] = acc[g * 4 + i][j];
        }
      }
    return;
  }
  if (OUT_MODE == 1) {
    // NCHW: each invocation's 4 rows are 4 consecutive positions of each of its columns, so one 16-byte store per
    // column (where the column's start is 4-aligned) instead of four scalar ones 4 * M_total apart
    const bool vec = (p.geo.z & 3) == 0 && (p.geo.x & 3) == 0;
    [[unroll]] for (int g = 0; g < TMG; ++g) {
      const int m = m_base + (ty + g * LY) * 4;   // the first of the 4 rows
      [[unroll]] for (int j = 0; j < TN4; ++j) {
        const int n4 = n4_base + tx + j * LX;
        if (m < M && n4 < N4) {
          vec4 v[4];
          [[unroll]] for (int i = 0; i < 4; ++i) {
            v[i] = acc[g * 4 + i][j] + W4(bias4, n4);
            v[i] = vec4(activate(v[i].x), activate(v[i].y), activate(v[i].z), activate(v[i].w));
          }
          const int n = n4 * 4, rem = min(p.dims.y - n, 4), col = p.geo.x + m;
          [[unroll]] for (int l = 0; l < 4; ++l) {
            if (l < rem) {
              if (vec && m + 3 < M) {
                o4[((n + l) * p.geo.z + col) >> 2] = to_out4(vec4(v[0][l], v[1][l], v[2][l], v[3][l]));
              } else {
                [[unroll]] for (int i = 0; i < 4; ++i)
                  if (m + i < M) o[(n + l) * p.geo.z + col + i] = to_out(v[i][l]);
              }
            }
          }
        }
      }
    }
    return;
  }
  // Row-major (OUT_MODE 0) or part-major (2): a column's 4-group is contiguous when the row (or part) width is a
  // multiple of 4.
  const bool vec = OUT_MODE == 0 ? (p.dims.y & 3) == 0 : (p.geo.w & 3) == 0;
  [[unroll]] for (int g = 0; g < TMG; ++g)
    [[unroll]] for (int i = 0; i < 4; ++i) {
      const int m = m_base + (ty + g * LY) * 4 + i;
      [[unroll]] for (int j = 0; j < TN4; ++j) {
        const int n4 = n4_base + tx + j * LX;
        if (m < M && n4 < N4) {
          vec4 v = acc[g * 4 + i][j] + W4(bias4, n4);
          v = vec4(activate(v.x), activate(v.y), activate(v.z), activate(v.w));
          const int n = n4 * 4, rem = min(p.dims.y - n, 4);
          if (vec && rem == 4) {   // 4 consecutive columns are 4 consecutive, 4-aligned elements: one vec4 each way
            const int idx = out_index(p.geo.x + m, n);
            o4[idx >> 2] = to_out4(activate_res4(v + (HAS_RES ? vec4(res4[idx >> 2]) : vec4(0.0))));
          } else {
            [[unroll]] for (int l = 0; l < 4; ++l)
              if (l < rem) {
                const int idx = out_index(p.geo.x + m, n + l);
                o[idx] = to_out(activate_res(v[l] + (HAS_RES ? float(res[idx]) : 0.0)));
              }
          }
        }
      }
    }
}
