#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// ReduceSum/Mean/Max/Min/L2 over any set of WHCN dims: one invocation per output texel, each lane looping
// over its reduced elements. The output may drop the reduced dims (keepdims=0): its linear index equals
// that of the keepdims shape, which maps straight onto the input.
#include "common.glslh"

layout(constant_id = 3) const int OP = 0;  // 0 sum, 1 mean, 2 max, 3 min, 4 L2 norm (sqrt of the sum of squares)

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 in_sizes;
  ivec4 cfg;  // packed dims of out and in, reduced-dims mask
} p;

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.out_sizes, p.cfg.x)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, p.cfg.x);
  int mask = p.cfg.z;
  ivec4 red = ivec4(1);   // extents of the reduced dims
  ivec4 keep = p.in_sizes;  // the keepdims output shape
  for (int d = 0; d < 4; ++d) if (((mask >> d) & 1) != 0) { red[d] = p.in_sizes[d]; keep[d] = 1; }
  int n = red.x * red.y * red.z * red.w;
  float inv_n = 1.0 / float(n);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.cfg.x] += l;
    if (i[p.cfg.x] >= p.out_sizes[p.cfg.x]) break;
    ivec4 base = unlin(lin(i, p.out_sizes), keep);
    float acc = OP == 2 ? -INF_F : OP == 3 ? INF_F : 0.0;
    for (int k = 0; k < n; ++k) {
      float v = LOAD(t_in, base + unlin(k, red), p.in_sizes, p.cfg.y);
      // GLSL leaves max() and min() of a NaN undefined (drivers tend to return the other operand): compare
      // instead, so a NaN element is taken and then kept (no comparison with it is true), as ONNX's max and min do
      acc = OP == 2 ? (v > acc || isnan(v) ? v : acc) : OP == 3 ? (v < acc || isnan(v) ? v : acc)
          : OP == 4 ? acc + v * v : acc + v;
    }
    if (OP <= 1 && (isinf(acc) || isnan(acc))) {
      // The running sum overflowed, or the elements hold inf or NaN: again with every element scaled by 1/n,
      // so only a sum whose own value is past the float range (never a mean of finite values) ends up infinite,
      // whatever the order of the elements. An inf or NaN element gives inf or NaN again.
      // (`precise`: else a compiler may add first and scale after)
      precise float scaled = 0.0;
      for (int k = 0; k < n; ++k) scaled += LOAD(t_in, base + unlin(k, red), p.in_sizes, p.cfg.y) * inv_n;
      acc = OP == 0 ? scaled * float(n) : scaled;
    } else if (OP == 1) {
      acc /= float(n);
    } else if (OP == 4 && isinf(acc)) {
      // The squares overflowed: again with every element scaled by the largest |element| m, then times m, so only
      // a norm past the float range is infinite (an inf element gives inf again, a NaN one NaN)
      float m = 0.0;
      for (int k = 0; k < n; ++k) m = max(m, abs(LOAD(t_in, base + unlin(k, red), p.in_sizes, p.cfg.y)));
      float scaled = 0.0;
      if (!isinf(m)) {
        for (int k = 0; k < n; ++k) {
          float v = LOAD(t_in, base + unlin(k, red), p.in_sizes, p.cfg.y) / m;
          scaled += v * v;
        }
      }
      acc = isinf(m) ? m : m * sqrt(scaled);
    } else if (OP == 4) {
      acc = sqrt(acc);
    }
    r[l] = acc;
  }
  STORE4(t_out, o, p.out_sizes, p.cfg.x, r);
}
