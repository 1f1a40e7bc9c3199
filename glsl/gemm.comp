#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture a=act,scratch dtype=float,half
// Tiled GEMM: out = act(A[M, K] * B[K, N] + bias[N]). The work group stages a BK-deep slice of A
// (BM rows) and of B (BN columns) in shared memory; each invocation keeps TM x (4 * TN4) outputs in
// registers (rows ty + i * ly, column groups tx + j * lx: strided so neighbouring invocations read
// neighbouring shared words). B is a weight prepacked once as [Kp][N4] vec4 (zero past K and N).
//   A_MODE 0: A row-major [M, K] with row stride LDA (a linear layer's input, or the im2col scratch);
//             in textures a width-packed [.., M, K] tensor.
//   A_MODE 1: A(m, k) = channel k at position m = (n * H + h) * W + w of an NCHW [N, K, H, W] tensor (pointwise
//             conv; ConvTranspose's columns, one work-group layer z per group: channels z * K .., B rows z * K ..,
//             output rows z * M ..).
//   OUT_MODE 0: out[m, n] row-major / width-packed. OUT_MODE 1: NCHW [1, N, H, W] with m = h * W + w
//             (conv output; in textures channels-packed, so a vec4 of 4 output channels is one texel).
#include "common.glslh"

layout(constant_id = 3) const int TM = 4;        // rows per invocation
layout(constant_id = 4) const int TN4 = 1;       // vec4 column groups per invocation
layout(constant_id = 5) const int BK = 16;       // k depth of a shared-memory stage
layout(constant_id = 6) const int A_MODE = 0;
layout(constant_id = 7) const int OUT_MODE = 0;
layout(constant_id = 8) const int ACT = 0;       // ACT_* of activation.glslh

TENSOR_OUT(t_out, 0)
#if defined(A_SCRATCH)
layout(set = 0, binding = 1, std430) readonly buffer a_buf { ELEM a_data[]; };
#else
TENSOR_IN(t_a, 1)
#endif
WEIGHTS(w_b, 2)
WEIGHTS(w_bias, 3)

layout(push_constant) uniform Params {
  ivec4 out_sizes;  // WHCN of the output tensor
  ivec4 a_sizes;    // WHCN of A's tensor (A_MODE 1 and textures)
  ivec4 dims;       // M (rows of this dispatch), N, K, N4
  ivec4 geo;        // m0 (output row of this dispatch's first row), LDA, A packed dim, unused
} p;

const int LX = int(gl_WorkGroupSize.x);
const int LY = int(gl_WorkGroupSize.y);
const int BM = LY * TM;
const int BN4 = LX * TN4;
#define GROUP int(gl_WorkGroupID.z)   // 0 but for grouped A_MODE 1 dispatches
shared float a_sh[BK * BM];     // [k][m]
shared vec4 b_sh[BK * BN4];     // [k][n4]

float a_at(int m, int k) {
  if (m >= p.dims.x || k >= p.dims.z) return 0.0;
#if defined(A_SCRATCH)
  return float(a_data[m * p.geo.y + k]);
#else
  int mm = m + p.geo.x;
  ivec4 i = A_MODE == 0 ? ivec4(k, mm % p.a_sizes.y, (mm / p.a_sizes.y) % p.a_sizes.z, mm / (p.a_sizes.y * p.a_sizes.z))
                        : ivec4(mm % p.a_sizes.x, (mm / p.a_sizes.x) % p.a_sizes.y, GROUP * p.dims.z + k,
                                mm / (p.a_sizes.x * p.a_sizes.y));
  return LOAD(t_a, i, p.a_sizes, p.geo.z);
#endif
}

#include "activation.glslh"

void store(int m, int n4, vec4 v) {
  int n = n4 * 4;
  if (m >= p.dims.x || n >= p.dims.y) return;
  v += W4(w_bias, n4);
  v = vec4(activate(v.x), activate(v.y), activate(v.z), activate(v.w));
  int mm = m + p.geo.x + GROUP * p.dims.x;
  int rem = p.dims.y - n;
  if (rem < 4) v = vec4(v.x, rem > 1 ? v.y : 0.0, rem > 2 ? v.z : 0.0, 0.0);
#if defined(STORAGE_TEXTURE)
  ivec3 pos = OUT_MODE == 0 ? ivec3(n4, mm % p.out_sizes.y, mm / p.out_sizes.y)
                            : ivec3(mm % p.out_sizes.x, mm / p.out_sizes.x, n4);
  imageStore(t_out, pos, sat_elem4(v));
#else
  int M = OUT_MODE == 0 ? 0 : p.out_sizes.x * p.out_sizes.y;
  for (int l = 0; l < min(rem, 4); ++l)
    t_out[OUT_MODE == 0 ? mm * p.dims.y + n + l : (n + l) * M + mm] = to_elem(v[l]);
#endif
}

void main() {
  int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
  int tid = ty * LX + tx;
  int m_base = int(gl_WorkGroupID.y) * BM;
  int n4_base = int(gl_WorkGroupID.x) * BN4;
  vec4 acc[TM][TN4];
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN4; ++j) acc[i][j] = vec4(0.0);

  for (int k0 = 0; k0 < p.dims.z; k0 += BK) {
    // Stage A: consecutive invocations take consecutive k of a row (contiguous in row-major A).
    for (int e = tid; e < BM * BK; e += LX * LY) {
      int r = e / BK, kk = e % BK;
      a_sh[kk * BM + r] = a_at(m_base + r, k0 + kk);
    }
    // Stage B: consecutive invocations take consecutive vec4 columns of a weight row.
    for (int e = tid; e < BN4 * BK; e += LX * LY) {
      int kk = e / BN4, c = e % BN4;
      int k = k0 + kk, n4 = n4_base + c;
      b_sh[kk * BN4 + c] = (k < p.dims.z && n4 < p.dims.w) ? W4(w_b, (GROUP * p.dims.z + k) * p.dims.w + n4)
                                                             : vec4(0.0);
    }
    barrier();
    for (int kk = 0; kk < BK; ++kk) {
      vec4 b[TN4];
      for (int j = 0; j < TN4; ++j) b[j] = b_sh[kk * BN4 + tx + j * LX];
      for (int i = 0; i < TM; ++i) {
        float a = a_sh[kk * BM + ty + i * LY];
        for (int j = 0; j < TN4; ++j) acc[i][j] += a * b[j];
      }
    }
    barrier();
  }
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN4; ++j) store(m_base + ty + i * LY, n4_base + tx + j * LX, acc[i][j]);
}
