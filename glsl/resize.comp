#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Resize over H and W (minirt/ops/resize.py) as a separable filter whose taps were computed at load: per output row
// TH (source row, weight) pairs, per output column TW (source column, weight) pairs, in one float32 table at every
// precision (rows first, columns from p.taps.z). Each invocation writes one output texel, 4 neighbours along the
// output's packed dim; each lane sums its rows' taps within each column tap, then the columns', in table order (the
// order ONNX's reference resizes the axes in). A source index of -1 marks a position outside tf_crop_and_resize's
// crop: there the output is the extrapolation value.
#include "common.glslh"

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)
layout(set = 0, binding = 2, std430) readonly buffer taps_buf { vec2 taps[]; };   // (source index, weight)

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 in_sizes;
  ivec4 t;       // TH, TW, first column tap
  ivec4 pd;      // packed dims of out, in
  vec4 extrap;   // extrapolation value
} p;

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.out_sizes, p.pd.x)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, p.pd.x);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] >= p.out_sizes[p.pd.x]) break;
    float acc = 0.0;
    bool outside = false;
    for (int tw = 0; tw < p.t.y; ++tw) {
      vec2 cx = taps[p.t.z + i.x * p.t.y + tw];
      float s = 0.0;
      for (int th = 0; th < p.t.x; ++th) {
        vec2 cy = taps[i.y * p.t.x + th];
        outside = outside || cx.x < 0.0 || cy.x < 0.0;
        s += cy.y * LOAD(t_in, ivec4(max(int(cx.x), 0), max(int(cy.x), 0), i.z, i.w), p.in_sizes, p.pd.y);
      }
      acc += cx.y * s;
    }
    r[l] = outside ? p.extrap.x : acc;
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
