#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Softmax over the WHCN dims in `mask` (one dim for opset >= 13, all dims from the axis inwards before),
// max-subtracted, in fp32: pass 1 max, pass 2 sum of exp, pass 3 write. See rows.glslh for the work split.
#include "common.glslh"
#include "rows.glslh"

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)

layout(push_constant) uniform Params {
  ivec4 sizes;  // of input and output
  ivec4 cfg;    // packed dim, reduced-dims mask
} p;

const float LOWEST = -3.402823466e38;  // not -inf: -inf - -inf would make NaN in masked lanes

void main() {
  ivec4 s = p.sizes;
  int pd = p.cfg.x, mask = p.cfg.y;
  ivec4 ts = texel_sizes(s, pd);
  int n = count_of(ts, mask), g = row_index();
  bool live = g < count_of(ts, 15 & ~mask), lanes_in_row = ((mask >> pd) & 1) != 0;
  int step = int(gl_WorkGroupSize.x);

  vec4 m = vec4(LOWEST);
  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    m = max(m, mix(vec4(LOWEST), LOAD4(t_in, o, s, pd), lanes_valid(o, s, pd)));
  }
  m = fold_max(group_max(m), lanes_in_row);

  vec4 sum = vec4(0.0);
  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    sum += mix(vec4(0.0), exp(LOAD4(t_in, o, s, pd) - m), lanes_valid(o, s, pd));
  }
  vec4 inv = 1.0 / fold_sum(group_sum(sum), lanes_in_row);

  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    STORE4(t_out, o, s, pd, mix(vec4(0.0), exp(LOAD4(t_in, o, s, pd) - m) * inv, lanes_valid(o, s, pd)));
  }
}
