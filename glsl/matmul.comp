#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture b=const,tensor dtype=float,half
// MatMul / Gemm: out[b, m, n] = alpha * sum_k A[b, m, k] * B[b, k, n] (+ bias[m, n]), numpy batch
// broadcasting. Each invocation computes a register tile:
//   TILE 0 (width-packed output): 4 consecutive m x 4 consecutive n, one output texel per row;
//   TILE 1 (channels-packed rank-4 texture output, e.g. attention scores, whose texel holds 4 heads):
//           4 m x 4 n texels, each over 4 consecutive C.
// b=const reads B from a prepacked weight buffer [B batch][K4][N4 / 4] of vec4 (zero past K and N);
// b=tensor reads a runtime tensor. Texture reads go along an operand's packed dim (4 values a texelFetch);
// buffer reads step a row base by k's stride.
#include "common.glslh"

layout(constant_id = 3) const int TILE = 0;
layout(constant_id = 4) const bool TRANS_A = false;   // A stored [.., K, M]
layout(constant_id = 5) const bool TRANS_B = false;   // runtime B stored [.., N, K]
layout(constant_id = 6) const bool HAS_BIAS = false;  // + bias[min(m, rows - 1), n]
layout(constant_id = 7) const bool SQUEEZE_M = false; // M = 1 and the output [.., N] lacks that dim (TILE 0)

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_a, 1)
#if defined(B_CONST)
WEIGHTS(w_b, 2)
#else
TENSOR_IN(t_b, 2)
#endif
WEIGHTS(w_bias, 3)  // [rows][N4 / 4]; a placeholder when !HAS_BIAS

layout(push_constant) uniform Params {
  ivec4 out_sizes;  // WHCN of the output: N, M, C, batch (N, C, batch with SQUEEZE_M)
  ivec4 a_sizes;
  ivec4 b_sizes;    // WHCN of B as [.., K, N] when B is constant
  ivec4 pd;         // packed dims of out, A, B; K
  ivec4 geo;        // bias rows, N4 / 4, K4 (weight rows per B batch)
  vec4 alpha;
} p;

const int AK = TRANS_A ? 1 : 0;  // WHCN dim of k in A; m is the other of W/H
const int BK = TRANS_B ? 0 : 1;  // WHCN dim of k in a runtime B
const ivec4 LANE = ivec4(0, 1, 2, 3);

ivec4 a_idx(int m, int k, int c, int n) { return TRANS_A ? ivec4(m, k, c, n) : ivec4(k, m, c, n); }
ivec4 b_idx(int k, int nn, int c, int n) { return TRANS_B ? ivec4(k, nn, c, n) : ivec4(nn, k, c, n); }

#if defined(B_CONST)
// Weight offset of B(k = 0, n0 .. n0 + 3) for output batch (c, n).
int w_base(int c, int n, int n0) {
  ivec4 s = p.b_sizes;
  return (min(c, s.z - 1) + s.z * min(n, s.w - 1)) * p.geo.z * p.geo.y + (n0 >> 2);
}
#endif

#if defined(STORAGE_TEXTURE)
// 4 values at i, i + e_d, .., i + 3 e_d, every index clamped into the tensor (numpy broadcasting and
// tile edges; lanes past an edge only feed outputs that are masked or not stored). i[d] is a multiple
// of 4, so along the packed dim this is one texel.
vec4 load4(highp sampler3D T, ivec4 i, ivec4 s, int pd, int d) {
  i = min(i, s - 1);
  if (d == pd) {
    vec4 t = texelFetch(T, texel_pos(i, s, pd), 0);
    return s[d] == 1 ? t.xxxx : t;
  }
  ivec4 e = ivec4(0);
  e[d] = 1;
  return vec4(LOAD(T, i, s, pd), LOAD(T, min(i + e, s - 1), s, pd), LOAD(T, min(i + 2 * e, s - 1), s, pd),
              LOAD(T, min(i + 3 * e, s - 1), s, pd));
}
vec4 a4(ivec4 i, int d) { return load4(t_a, i, p.a_sizes, p.pd.y, d); }
#if !defined(B_CONST)
vec4 b4(ivec4 i, int d) { return load4(t_b, i, p.b_sizes, p.pd.z, d); }
#endif
#else
// Buffers are dense row-major: element k of an operand's row is at the row's base + k * (stride of k's dim).
int stride(ivec4 s, int d) { return d == 0 ? 1 : d == 1 ? s.x : d == 2 ? s.x * s.y : s.x * s.y * s.z; }
// Offset of WHCN index i clamped into sizes s (numpy broadcasting; rows past a tile edge are never stored).
int at(ivec4 i, ivec4 s) { return lin(min(i, s - 1), s); }
#endif

// TILE 0: rows m0 .. m0 + 3 of output batch (c, n).
void tile_rows(int n0, int m0, int c, int n, ivec4 os) {
  int K = p.pd.w, nq = p.geo.y;
  mat4 acc = mat4(0.0);  // acc[i] = out(m0 + i, n0 .. n0 + 3)
#if defined(B_CONST)
  int wb = w_base(c, n, n0);
#endif
#if !defined(STORAGE_TEXTURE)
  ivec4 sa = p.a_sizes, sb = p.b_sizes;
  ivec4 ab = ivec4(at(a_idx(m0, 0, c, n), sa), at(a_idx(m0 + 1, 0, c, n), sa), at(a_idx(m0 + 2, 0, c, n), sa),
                   at(a_idx(m0 + 3, 0, c, n), sa));
  int ak = stride(sa, AK);
#if !defined(B_CONST)
  ivec4 bb = ivec4(at(b_idx(0, n0, c, n), sb), at(b_idx(0, n0 + 1, c, n), sb), at(b_idx(0, n0 + 2, c, n), sb),
                   at(b_idx(0, n0 + 3, c, n), sb));
  int bk = stride(sb, BK);
#endif
#endif
  for (int k0 = 0; k0 < K; k0 += 4) {
    mat4 a;  // a[i] = A(m0 + i, k0 .. k0 + 3)
    mat4 b;  // b[kk] = B(k0 + kk, n0 .. n0 + 3)
#if defined(STORAGE_TEXTURE)
    if (p.pd.y == AK) {
      for (int i = 0; i < 4; ++i) a[i] = a4(a_idx(m0 + i, k0, c, n), AK);
    } else {
      for (int kk = 0; kk < 4; ++kk) a[kk] = a4(a_idx(m0, k0 + kk, c, n), 1 - AK);
      a = transpose(a);
    }
#if !defined(B_CONST)
    if (p.pd.z == BK) {
      for (int j = 0; j < 4; ++j) b[j] = b4(b_idx(k0, n0 + j, c, n), BK);
      b = transpose(b);
    } else {
      for (int kk = 0; kk < 4; ++kk) b[kk] = b4(b_idx(k0 + kk, n0, c, n), 1 - BK);
    }
#endif
#else
    ivec4 kl = min(k0 + LANE, K - 1);  // clamped in the K tail, then masked below
    ivec4 ao = kl * ak;
    for (int i = 0; i < 4; ++i)
      a[i] = vec4(float(t_a[ab[i] + ao.x]), float(t_a[ab[i] + ao.y]), float(t_a[ab[i] + ao.z]), float(t_a[ab[i] + ao.w]));
#if !defined(B_CONST)
    ivec4 bo = kl * bk;
    for (int kk = 0; kk < 4; ++kk)
      b[kk] = vec4(float(t_b[bb.x + bo[kk]]), float(t_b[bb.y + bo[kk]]), float(t_b[bb.z + bo[kk]]), float(t_b[bb.w + bo[kk]]));
#endif
#endif
#if defined(B_CONST)
    for (int kk = 0; kk < 4; ++kk) b[kk] = W4(w_b, wb + (k0 + kk) * nq);
#endif
    if (k0 + 4 > K) {  // the K tail: clamped reads past K must not count
      bvec4 live = lessThan(k0 + LANE, ivec4(K));
      for (int i = 0; i < 4; ++i) {
        a[i] = mix(vec4(0.0), a[i], live);
        b[i] = live[i] ? b[i] : vec4(0.0);
      }
    }
    acc += b * a;  // (b * a)[i] = sum_kk b[kk] * a[i][kk]
  }
  bvec4 nlive = lessThan(n0 + LANE, ivec4(os.x));
  for (int i = 0; i < 4; ++i) {
    int m = m0 + i;
    if (m >= os.y) break;
    vec4 r = acc[i] * p.alpha.x;
    if (HAS_BIAS) r += W4(w_bias, min(m, p.geo.x - 1) * nq + (n0 >> 2));
    ivec4 o = SQUEEZE_M ? ivec4(n0, c, n, 0) : ivec4(n0, m, c, n);
    STORE4(t_out, o, p.out_sizes, 0, mix(vec4(0.0), r, nlive));
  }
}

#if defined(STORAGE_TEXTURE)
// TILE 1: channels c0 .. c0 + 3 (one output texel) at rows m0 .. m0 + 3 of output batch n.
void tile_heads(int n0, int m0, int c0, int n, ivec4 os) {
  int K = p.pd.w, nq = p.geo.y;
  mat4 acc[4] = mat4[4](mat4(0.0), mat4(0.0), mat4(0.0), mat4(0.0));  // acc[r][j] = out(c0 .., m0 + r, n0 + j)
#if defined(B_CONST)
  ivec4 wb = ivec4(w_base(c0, n, n0), w_base(c0 + 1, n, n0), w_base(c0 + 2, n, n0), w_base(c0 + 3, n, n0));
#endif
  for (int k = 0; k < K; ++k) {
    mat4 a;  // a[r] = A(c0 .. c0 + 3, m0 + r, k)
    for (int r = 0; r < 4; ++r) a[r] = a4(a_idx(m0 + r, k, c0, n), 2);
    mat4 b;  // b[j] = B(c0 .. c0 + 3, k, n0 + j)
#if defined(B_CONST)
    for (int i = 0; i < 4; ++i) b[i] = W4(w_b, wb[i] + k * nq);
    b = transpose(b);
#else
    if (p.pd.z == 2) {
      for (int j = 0; j < 4; ++j) b[j] = b4(b_idx(k, n0 + j, c0, n), 2);
    } else {
      for (int i = 0; i < 4; ++i) b[i] = b4(b_idx(k, n0, c0 + i, n), 1 - BK);
      b = transpose(b);
    }
#endif
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] += a[r] * b[j];
  }
  bvec4 clive = lessThan(c0 + LANE, ivec4(os.z));
  for (int r = 0; r < 4; ++r) {
    int m = m0 + r;
    if (m >= os.y) break;
    vec4 bias = HAS_BIAS ? W4(w_bias, min(m, p.geo.x - 1) * nq + (n0 >> 2)) : vec4(0.0);
    for (int j = 0; j < 4; ++j) {
      if (n0 + j >= os.x) break;
      STORE4(t_out, ivec4(n0 + j, m, c0, n), os, 2, mix(vec4(0.0), acc[r][j] * p.alpha.x + bias[j], clive));
    }
  }
}
#endif

void main() {
  ivec3 g = ivec3(gl_GlobalInvocationID);
  ivec4 os = SQUEEZE_M ? ivec4(p.out_sizes.x, 1, p.out_sizes.yz) : p.out_sizes;
  int n0 = g.x * 4;
#if defined(STORAGE_TEXTURE)
  if (TILE == 1) {
    int ce = (os.z + 3) >> 2;
    if (n0 < os.x && g.y * 4 < os.y && g.z < ce * os.w) tile_heads(n0, g.y * 4, (g.z % ce) * 4, g.z / ce, os);
    return;
  }
#endif
  if (n0 < os.x && g.y * 4 < os.y && g.z < os.z * os.w) tile_rows(n0, g.y * 4, g.z % os.z, g.z / os.z, os);
}
