#version 450
#extension GL_GOOGLE_include_directive : require
// variants: dtype=float,half
// DynamicQuantizeLinear of a whole tensor (buffers), as ONNX defines it for uint8, for the int8-weight GEMM that reads
// it (minirt/planner/fold_dynamic_quantize.py): one work group finds the tensor's min and max (with 0), the scale
// s = (max - min) / 255 and zero point z = clamp(roundEven(-min / s), 0, 255), and writes each element's quantized
// value less the zero point, clamp(roundEven(x / s) + z, 0, 255) - z (a whole number in [-255, 255], exact in fp16 too),
// and s. The GEMM's sums of these times int8 weights are MatMulInteger's.
#include "common.glslh"

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM o[]; };
layout(set = 0, binding = 1, std430) writeonly buffer s_buf { ELEM s_out[]; };
layout(set = 0, binding = 2, std430) readonly buffer x_buf { ELEM x[]; };

layout(push_constant) uniform Params {
  ivec4 dims;   // elements
} p;

const int L = int(gl_WorkGroupSize.x);   // a power of two
shared vec2 red[L];

void main() {
  const int t = int(gl_LocalInvocationID.x), n = p.dims.x;
  vec2 mm = vec2(0.0);                   // (min, max), with 0 in the range as ONNX's definition has it
  for (int i = t; i < n; i += L) {
    const float v = float(x[i]);
    mm = vec2(min(mm.x, v), max(mm.y, v));
  }
  red[t] = mm;
  for (int h = L >> 1; h > 0; h >>= 1) {
    barrier();
    if (t < h) red[t] = vec2(min(red[t].x, red[t + h].x), max(red[t].y, red[t + h].y));
  }
  barrier();
  const float s = (red[0].y - red[0].x) / 255.0;
  const float z = s > 0.0 ? clamp(roundEven(-red[0].x / s), 0.0, 255.0) : 0.0;
  for (int i = t; i < n; i += L) {
    const float q = s > 0.0 ? clamp(roundEven(float(x[i]) / s) + z, 0.0, 255.0) : z;
    o[i] = to_elem(q - z);
  }
  if (t == 0) s_out[0] = to_elem(s);
}
