#version 450
// variants: w=float,i8 dtype=half io=elem,out32
// The buffer GEMM of glsl/linear.comp on tensor cores through VK_NV_cooperative_matrix2 (workgroup-scope matrices,
// tensor addressing, per-element operations), for precision fp16: out = act(A[M, K] @ B[K, N] + bias) (+ residual),
// with linear_cm.glslh's bindings and push constants. A: fp16 activations, row-major, row stride LDA4 vec4, K a
// multiple of 4 (no A_WIN: those GEMMs stay on linear_cm). B: the packed weight [K][N4] f16vec4 (zero past N), read
// as a K x 4 N4 row-major matrix. Built by glslang 16+ (tools/build_shaders.py: $GLSLANG_CM2).
//
// One work group of WG invocations (the local size, as the device's flexible-dimension properties list for f16 x f16
// -> f32 at workgroup scope: minirt/kernels/gemm.py CM2_TILES) computes one BM x BN block of the output as a single
// workgroup-scope fp32 accumulator, over BK-deep slices of A (BM x BK) and B (BK x BN) that coopMatLoadTensorNV takes
// straight from the buffers; the driver stages them (its own shared memory). Tensor layouts clamp every load to the
// matrix, so rows past M, columns past the padded N and k past K read zero and ragged blocks are exact; blocks wholly
// inside (K a whole number of slices, row strides whole 16-byte runs) take the same loop through layouts without
// clamping, unrolled.
// Epilogue: one coopMatPerElementNV over the accumulator adds the bias, applies the activation and the residual (as
// linear_cm.glslh: act(x + bias), then act_res(. + residual)), saturated to fp16's range unless io=out32; then a
// tensor store clamped to the output (elements past M or N are not written):
//   OUT_MODE 0: out row-major [M0 + M, N] at rows M0 + m.
//   OUT_MODE 1: out [N][M_total] (column n at n * M_total + M0 + m): the same store through a transposing view.
//   OUT_MODE 2: out part-major [N / NP][M_total][NP]: a block inside one part is stored into that part; a block
//               across parts (NP not a multiple of BN) is stored element by element by a second per-element pass.
// io=out32: the output is float32 (a graph output at fp16, minirt/planner/lower.py), unsaturated.
// w=i8: B is int8 [K][4 N4] (minirt/ops/int8_weight.py, a byte an element) with a scale per column and no zero point
// (gemm.py takes symmetric weights only): each slice is loaded as an int8 matrix and converted to fp16 (exact), and
// the scale multiplies the sum in the epilogue, before the bias. Binding 5: scale [4 N4] (then the zero points,
// unread), as qweight.glslh lays them out.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#if defined(W_I8)
#extension GL_EXT_shader_8bit_storage : require
#endif
#include "common.glslh"

// The block (BM x BN, BK-deep slices): a multiple of the device's granularities (gemm.py checks them)
layout(constant_id = 3) const uint BM = 128;
layout(constant_id = 4) const uint BN = 128;
layout(constant_id = 5) const uint BK = 32;
layout(constant_id = 6) const int OUT_MODE = 0;
layout(constant_id = 7) const int ACT = 0;           // ACT_* of activation.glslh
layout(constant_id = 8) const bool HAS_RES = false;  // + residual, indexed as the output

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { OUT_ELEM o[]; };
layout(set = 0, binding = 1, std430) readonly buffer a_buf { float16_t a[]; };
#if defined(W_I8)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { int8_t b[]; };
layout(set = 0, binding = 5, std430) readonly buffer q_buf { float qscale[]; };
#define SCALE(n) qscale[n]
#else
layout(set = 0, binding = 2, std430) readonly buffer b_buf { float16_t b[]; };
#define SCALE(n) 1.0
#endif
layout(set = 0, binding = 3, std430) readonly buffer bias_buf { ELEM bias[]; };
layout(set = 0, binding = 4, std430) readonly buffer r_buf { ELEM res[]; };

layout(push_constant) uniform Params {
  ivec4 dims;   // M (rows of this dispatch), N, K, N4
  ivec4 geo;    // M0 (first output row), LDA4 (A row stride in vec4), M_total (OUT_MODE 1, 2), NP (OUT_MODE 2)
  ivec4 win;    // unused (linear_cm.glslh's A_WIN; pushed as zeros)
} p;

#include "activation.glslh"

#if defined(IO_OUT32)
#define SAT(x) (x)
#else
#define SAT(x) sat_elem(x)
#endif

// Where output element (m, n) of this dispatch lies in the output buffer (and the residual, which shares its layout)
uint out_index(uint m, uint n) {
  const uint M0 = uint(p.geo.x), MT = uint(p.geo.z), NP = uint(p.geo.w);
  if (OUT_MODE == 1) return n * MT + M0 + m;
  if (OUT_MODE == 2) {
    const uint part = n / NP;
    return (part * MT + M0 + m) * NP + (n - part * NP);
  }
  return (M0 + m) * uint(p.dims.y) + n;
}

// The epilogue of one accumulator element at (row, col) of the block whose first output element is (m0, n0)
float epilogue(const in uint32_t row, const in uint32_t col, const in float x, const in uint32_t m0,
               const in uint32_t n0) {
  const uint m = m0 + row, n = n0 + col;
  if (m >= uint(p.dims.x) || n >= uint(p.dims.y)) return 0.0;   // not stored
  float v = activate(x * SCALE(n) + float(bias[n]));
  if (HAS_RES) v += float(res[out_index(m, n)]);
  return SAT(activate_res(v));
}

// OUT_MODE 2 across parts: each element stored on its own
float store_one(const in uint32_t row, const in uint32_t col, const in float x, const in uint32_t m0,
                const in uint32_t n0) {
  const uint m = m0 + row, n = n0 + col;
  if (m < uint(p.dims.x) && n < uint(p.dims.y)) o[out_index(m, n)] = OUT_ELEM(x);
  return x;
}

#define ACC coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#if defined(W_I8)   // the int8 slice, converted to fp16 as it is multiplied
#define LOAD_B(mb, LB, k0) \
    coopmat<int8_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> mq; \
    coopMatLoadTensorNV(mq, b, 0, sliceTensorLayoutNV(LB, k0, BK, n_base, BN)); \
    mb = MAT_B(mq);
#else
#define LOAD_B(mb, LB, k0) coopMatLoadTensorNV(mb, b, 0, sliceTensorLayoutNV(LB, k0, BK, n_base, BN));
#endif
#define CLAMP gl_CooperativeMatrixClampModeConstantNV
#define UNROLL 4u             // slices a trip of the whole blocks' K loop

void main() {
  const uint M = uint(p.dims.x), N = uint(p.dims.y), K = uint(p.dims.z), NB = uint(p.dims.w) * 4u;
  const uint LDA = uint(p.geo.y) * 4u;
  const uint m_base = gl_WorkGroupID.y * BM, n_base = gl_WorkGroupID.z * BN;

  ACC acc = ACC(0.0);
  // One BK-deep slice at k0 through layouts LA (M x K, row stride LDA) and LB (K x NB, row stride NB)
#define SLICE(LA, LB, k0) { \
    MAT_A ma; \
    MAT_B mb; \
    coopMatLoadTensorNV(ma, a, 0, sliceTensorLayoutNV(LA, m_base, BM, k0, BK)); \
    LOAD_B(mb, LB, k0) \
    acc = coopMatMulAdd(ma, mb, acc); }
  if (m_base + BM <= M && n_base + BN <= NB && K % BK == 0u && (LDA & 7u) == 0u && (NB & 7u) == 0u) {
    // A whole block: layouts without clamping, row strides known to be whole 16-byte runs (& ~7, as llama.cpp's
    // mul_mm_cm2 hints them), UNROLL slices a trip (then the rest)
    tensorLayoutNV<2> la = createTensorLayoutNV(2);
    tensorLayoutNV<2> lb = createTensorLayoutNV(2);
    la = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(la, M, K), LDA & ~7u, 1);
    lb = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lb, K, NB), NB & ~7u, 1);
    uint k0 = 0;
    for (; k0 + UNROLL * BK <= K;)
      [[unroll]] for (uint j = 0; j < UNROLL; ++j) {
        SLICE(la, lb, k0)
        k0 += BK;
      }
    for (; k0 < K; k0 += BK) SLICE(la, lb, k0)
  } else {
    // a ragged block (or K, or strides that are not whole 16-byte runs): every load clamped to the matrices
    tensorLayoutNV<2, CLAMP> la = createTensorLayoutNV(2, CLAMP);
    tensorLayoutNV<2, CLAMP> lb = createTensorLayoutNV(2, CLAMP);
    la = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(la, M, K), LDA, 1);
    lb = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lb, K, NB), NB, 1);
    for (uint k0 = 0; k0 < K; k0 += BK) SLICE(la, lb, k0)
  }

  coopMatPerElementNV(acc, acc, epilogue, m_base, n_base);

  const uint M0 = uint(p.geo.x), MT = uint(p.geo.z), NP = uint(p.geo.w);
  if (OUT_MODE == 2 && n_base / NP != (min(n_base + BN, N) - 1u) / NP) {
    coopMatPerElementNV(acc, acc, store_one, m_base, n_base);
    return;
  }
  coopmat<OUT_ELEM, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> d =
      coopmat<OUT_ELEM, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
  tensorLayoutNV<2, CLAMP> lo = createTensorLayoutNV(2, CLAMP);
  if (OUT_MODE == 1) {   // [N][M_total]: rows n, columns M0 + m, stored through a transposing view
    lo = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lo, N, M0 + M), MT, 1);
    tensorViewNV<2, false, 1, 0> tr = createTensorViewNV(2, false, 1, 0);
    coopMatStoreTensorNV(d, o, 0, sliceTensorLayoutNV(lo, n_base, BN, M0 + m_base, BM), tr);
  } else if (OUT_MODE == 2) {   // the part holding this block: [M_total][NP] at part * M_total * NP
    const uint part = n_base / NP;
    lo = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lo, M0 + M, NP), NP, 1);
    coopMatStoreTensorNV(d, o, part * MT * NP, sliceTensorLayoutNV(lo, M0 + m_base, BM, n_base - part * NP, BN));
  } else {
    lo = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lo, M0 + M, N), N, 1);
    coopMatStoreTensorNV(d, o, 0, sliceTensorLayoutNV(lo, M0 + m_base, BM, n_base, BN));
  }
}
