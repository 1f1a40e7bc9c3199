#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Elementwise unary op; OP picks the function. Also serves as a plain copy (OP 0).
#include "common.glslh"

layout(constant_id = 3) const int OP = 0;
// 0 identity, 1 sqrt, 2 erf, 3 gelu (erf), 4 gelu (tanh), 5 relu, 6 sigmoid, 7 tanh, 8 neg, 9 exp, 10 abs,
// 11 clip (to [prm.x, prm.y]), 12 hard sigmoid (alpha prm.x, beta prm.y), 13 hard swish, 14 log, 15 reciprocal,
// 16 NaN replaced by prm.x, 17 silu (x * sigmoid(x), as Sigmoid then Mul round it), 18 quantize-dequantize
// (clamp(round_half_even(x / prm.x), prm.y, prm.z) * prm.x, prm.w = 1 / prm.x: an activation's Q/DQ pair; qdq()).

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 in_sizes;
  ivec4 pd;  // packed dims of out, in
  vec4 prm;  // the function's parameters (clip bounds, hard sigmoid's alpha and beta, NaN's replacement, Q/DQ's
             // scale and levels)
} p;

// The exact product a * b as hi + lo (Dekker's split into 12-bit halves; `precise`: no fused multiply-add, whose
// rounding would break it).
void two_prod(float a, float b, out float hi, out float lo) {
  precise float p = a * b;
  precise float ca = 4097.0 * a;
  precise float ah = ca - (ca - a);
  precise float al = a - ah;
  precise float cb = 4097.0 * b;
  precise float bh = cb - (cb - b);
  precise float bl = b - bh;
  precise float e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
  hi = p;
  lo = e;
}

// The sign of fl(x / s) - m (0: the correctly rounded quotient is m), for s > 0 and m = k + 0.5 near x / s: the
// remainder x - m s, exact (x - hi by Sterbenz's lemma, as x is near m s), against half an ulp of m times s.
int quotient_vs(float x, float s, float m) {
  float hi, lo;
  two_prod(m, s, hi, lo);
  precise float r = (x - hi) - lo;
  int e;
  frexp(m, e);
  float half_ulp_s = ldexp(s, e - 25);   // |m| in [2^(e-1), 2^e): ulp 2^(e-24)
  return r > half_ulp_s ? 1 : r < -half_ulp_s ? -1 : 0;
}

// ONNX QuantizeLinear then DequantizeLinear as onnxruntime computes them: round_half_even(fl(x / s)) (fl: the
// correctly rounded float32 quotient), clamped to the levels, times s. Vulkan allows 2.5 ulp in a division, so the
// quotient here is x times 1 / s, and the rounding is settled exactly where it lies near a half.
float qdq(float x) {
  float s = p.prm.x;
  float k = roundEven(x * p.prm.w);
  if (k >= p.prm.y - 1.0 && k <= p.prm.z + 1.0) {
    int up = quotient_vs(x, s, k + 0.5);
    if (up > 0 || (up == 0 && mod(k + 1.0, 2.0) == 0.0)) {
      k += 1.0;
    } else {
      int down = quotient_vs(x, s, k - 0.5);
      if (down < 0 || (down == 0 && mod(k - 1.0, 2.0) == 0.0)) k -= 1.0;
    }
  }
  return clamp(k, p.prm.y, p.prm.z) * s;
}

float apply(float x) {
  if (OP == 0) return x;
  if (OP == 1) return sqrt(x);
  if (OP == 2) return erf_f(x);
  if (OP == 3) return 0.5 * x * (1.0 + erf_f(x * 0.70710678118654752));
  if (OP == 4) {
    float u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh_f(u));
  }
  if (OP == 5) return relu_f(x);
  if (OP == 6) return 1.0 / (1.0 + exp(-x));
  if (OP == 7) return tanh_f(x);
  if (OP == 8) return -x;
  if (OP == 9) return exp(x);
  if (OP == 10) return abs(x);
  if (OP == 11) return clip_f(x, p.prm.x, p.prm.y);
  if (OP == 12) return clip_f(p.prm.x * x + p.prm.y, 0.0, 1.0);
  if (OP == 13) return hard_swish_f(x);
  if (OP == 14) return isnan(x) || x == INF_F ? x : x < 0.0 ? NAN_F : x == 0.0 ? -INF_F : log(x);
  if (OP == 16) return isnan(x) ? p.prm.x : x;
  if (OP == 17) return x * (1.0 / (1.0 + exp(-x)));
  if (OP == 18) return qdq(x);
  return 1.0 / x;
}

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.out_sizes, p.pd.x)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, p.pd.x);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] >= p.out_sizes[p.pd.x]) break;
    r[l] = apply(LOAD(t_in, bcast(i, p.in_sizes), p.in_sizes, p.pd.y));
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
