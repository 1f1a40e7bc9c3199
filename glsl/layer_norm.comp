#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half io=elem,out32
// exclude: dtype=float io=out32
// LayerNormalization over the WHCN dims in `mask` (all dims from the axis inwards), two-pass in fp32:
// mean, then mean of squared deviations (no cancellation for large offsets). Both passes work on x minus
// the row's first element, so a large common offset costs no precision in the mean either. See rows.glslh.
// io=out32 (fp16): the output is a float32 graph output, written as it is.
#include "common.glslh"
#include "rows.glslh"

layout(constant_id = 3) const bool HAS_BIAS = true;

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)
// Scale then bias, one vec4 per texel of a row (the lanes a texel's output lanes need), prepacked on the CPU.
WEIGHTS(w_affine, 2)

layout(push_constant) uniform Params {
  ivec4 sizes;  // of input and output
  ivec4 cfg;    // packed dim, reduced-dims mask
  vec4 eps;     // epsilon
} p;

void main() {
  ivec4 s = p.sizes;
  int pd = p.cfg.x, mask = p.cfg.y;
  ivec4 ts = texel_sizes(s, pd);
  int n = count_of(ts, mask), g = row_index();
  bool live = g < count_of(ts, 15 & ~mask), lanes_in_row = ((mask >> pd) & 1) != 0;
  int step = int(gl_WorkGroupSize.x);
  float inv_len = 1.0 / float(count_of(s, mask));

  vec4 pivot = live ? LOAD4(t_in, row_origin(g, 0, ts, mask, pd), s, pd) : vec4(0.0);
  if (lanes_in_row) pivot = vec4(pivot.x);

  vec4 sum = vec4(0.0);
  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    sum += mix(vec4(0.0), LOAD4(t_in, o, s, pd) - pivot, lanes_valid(o, s, pd));
  }
  vec4 shift = fold_sum(group_sum(sum), lanes_in_row) * inv_len;  // mean - pivot

  vec4 sq = vec4(0.0);
  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    vec4 d = (LOAD4(t_in, o, s, pd) - pivot) - shift;
    sq += mix(vec4(0.0), d * d, lanes_valid(o, s, pd));
  }
  vec4 rstd = inversesqrt(fold_sum(group_sum(sq), lanes_in_row) * inv_len + p.eps.x);

  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    vec4 y = ((LOAD4(t_in, o, s, pd) - pivot) - shift) * rstd * W4(w_affine, r);
    if (HAS_BIAS) y += W4(w_affine, n + r);
    STORE4(t_out, o, s, pd, mix(vec4(0.0), y, lanes_valid(o, s, pd)));
  }
}
