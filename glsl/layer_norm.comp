#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half io=elem,out32
// exclude: dtype=float io=out32
// LayerNormalization over the WHCN dims in `mask` (all dims from the axis inwards), two-pass in fp32:
// mean, then mean of squared deviations (no cancellation for large offsets). Both passes work on x minus
// the row's first element, so a large common offset costs no precision in the mean either. See rows.glslh.
// Huge values: a row of finite values never gives NaN. The mean adds (x - pivot) / n, which does not overflow. The
// pivot is the first element only where that is below PIVOT_MAX, else 0, so x - pivot stays in range; every add of
// the scaled terms within an invocation is `precise`, as compilers may otherwise add first and scale after (Mesa's
// and NVIDIA's do; GLSL's fma() would not be covered). Across invocations the sum goes through shared memory.
// The squared deviations are added unscaled, as onnxruntime adds them: where their sum passes the float range the
// variance is inf, 1 / std is 0 and the row comes out as B (x - mean, itself inf where the row spans more than the
// float range, counts as 0 there).
// io=out32 (fp16): the output is a float32 graph output, written as it is.
// PER_CHANNEL (InstanceNormalization): the scale and bias are one value per index of WHCN dim cfg.z (the channel, not
// normalised), C scales then C biases from vec4 cfg.w on, instead of one vec4 per texel of a row.
#include "common.glslh"
#include "rows.glslh"

layout(constant_id = 3) const bool HAS_BIAS = true;
layout(constant_id = 4) const bool PER_CHANNEL = false;

// 2^102: a pivot below it leaves x - pivot finite for every finite x (past FLT_MAX by less than half its ulp). In a
// row whose first element is this large, two elements differ by 0 or by at least 2^79 (its ulp), so unless all are
// equal some deviation from the mean is at least 2^78, its square overflows and the output is B whatever the pivot:
// the precision a pivot buys is not needed there.
const float PIVOT_MAX = 5.0706024e30;

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)
// Scale then bias, one vec4 per texel of a row (the lanes a texel's output lanes need), prepacked on the CPU; with
// PER_CHANNEL one value per channel.
WEIGHTS(w_affine, 2)

layout(push_constant) uniform Params {
  ivec4 sizes;  // of input and output
  ivec4 cfg;    // packed dim, reduced-dims mask; PER_CHANNEL: the channel's WHCN dim, the biases' first vec4
  vec4 eps;     // epsilon
} p;

float channel_value(int i) { return W4(w_affine, i >> 2)[i & 3]; }

// PER_CHANNEL: the values at channel index k + the lane's channel offset (each lane its own channel where the channel
// dim is the packed one), from vec4 `first` on.
vec4 per_channel(int k, int first, int pd) {
  ivec4 c = ivec4(k) + (p.cfg.z == pd ? ivec4(0, 1, 2, 3) : ivec4(0));
  c = min(c, ivec4(p.sizes[p.cfg.z] - 1)) + ivec4(first * 4);   // lanes past the end: any value (not stored)
  return vec4(channel_value(c.x), channel_value(c.y), channel_value(c.z), channel_value(c.w));
}

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
  pivot = mix(pivot, vec4(0.0), greaterThanEqual(abs(pivot), vec4(PIVOT_MAX)));

  precise vec4 sum = vec4(0.0);
  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    sum += mix(vec4(0.0), (LOAD4(t_in, o, s, pd) - pivot) * inv_len, lanes_valid(o, s, pd));
  }
  vec4 shift = fold_sum(group_sum(sum), lanes_in_row);  // mean - pivot

  vec4 sq = vec4(0.0);
  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    vec4 d = (LOAD4(t_in, o, s, pd) - pivot) - shift;
    sq += mix(vec4(0.0), d * d, lanes_valid(o, s, pd));
  }
  vec4 rstd = inversesqrt(fold_sum(group_sum(sq), lanes_in_row) * inv_len + p.eps.x);

  for (int r = int(gl_LocalInvocationID.x); live && r < n; r += step) {
    ivec4 o = row_origin(g, r, ts, mask, pd);
    vec4 d = (LOAD4(t_in, o, s, pd) - pivot) - shift;
    vec4 y = mix(d * rstd, vec4(0.0), equal(rstd, vec4(0.0)));
    if (PER_CHANNEL) {
      y = y * per_channel(o[p.cfg.z], 0, pd) + per_channel(o[p.cfg.z], p.cfg.w, pd);
    } else {
      y *= W4(w_affine, r);
      if (HAS_BIAS) y += W4(w_affine, n + r);
    }
    STORE4(t_out, o, s, pd, mix(vec4(0.0), y, lanes_valid(o, s, pd)));
  }
}
