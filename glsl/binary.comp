#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Elementwise binary op with numpy broadcasting; OP picks the function.
#include "common.glslh"

layout(constant_id = 3) const int OP = 0;  // 0 add, 1 sub, 2 mul, 3 div, 4 pow

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_a, 1)
TENSOR_IN(t_b, 2)

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 a_sizes;
  ivec4 b_sizes;
  ivec4 pd;  // packed dims of out, a, b
} p;

// C's pow (as onnxruntime's Pow), case by case where GLSL's pow is undefined (a base of 0 or below, NaN): 1 for b = 0
// or a = 1 whatever the other is, even NaN; otherwise a NaN gives NaN; an infinite exponent gives 0, 1 or inf by |a|
// alone; a negative base needs an integer exponent (the result then signed by its parity), except -inf and -0, whose
// non-integer powers are those of +inf and +0.
float pow_f(float a, float b) {
  if (b == 0.0 || a == 1.0) return 1.0;
  if (isnan(a) || isnan(b)) return a + b;
  if (isinf(b)) return abs(a) == 1.0 ? 1.0 : (abs(a) > 1.0) == (b > 0.0) ? abs(b) : 0.0;
  float r = a == 0.0 ? (b < 0.0 ? uintBitsToFloat(0x7f800000u) : 0.0) : pow(abs(a), b);
  if (floatBitsToUint(a) >= 0x80000000u) {   // a < 0, or -0
    if (fract(b) != 0.0) return a < 0.0 && !isinf(a) ? NAN_F : r;
    if (mod(b, 2.0) == 1.0) r = -r;
  }
  return r;
}

float apply(float a, float b) {
  if (OP == 0) return a + b;
  if (OP == 1) return a - b;
  if (OP == 2) return a * b;
  if (OP == 3) return a / b;
  return pow_f(a, b);
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
    float a = LOAD(t_a, bcast(i, p.a_sizes), p.a_sizes, p.pd.y);
    float b = LOAD(t_b, bcast(i, p.b_sizes), p.b_sizes, p.pd.z);
    r[l] = apply(a, b);
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
