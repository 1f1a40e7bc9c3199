#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half io=elem,in32
// exclude: dtype=float io=in32
// exclude: storage=texture io=in32
// im2col for a 2-D conv (batch 1): scratch[r, k] = input at output position m0 + r, tap and channel k,
// with k ordered (kh, kw, c) so 4 consecutive k of a channels-packed texture share one tap; zero where
// the tap falls in the padding. The scratch is a plain buffer [rows, Kp] (Kp = K rounded up to 4) in
// both storages; the GEMM reads it as A. io=in32 (fp16, buffers): the input is a float32 graph input, read as
// it is (in textures the sampler converts, so they need no such variant).
#include "common.glslh"

layout(set = 0, binding = 0, std430) writeonly buffer s_buf { ELEM4 scratch4[]; };   // rows of Kp, Kp % 4 == 0
TENSOR_IN(t_in, 1)

layout(push_constant) uniform Params {
  ivec4 in_sizes;  // WHCN of the input [1, C, H, W]
  ivec4 kern;      // KH, KW, stride h, stride w
  ivec4 pad;       // pad top, pad left, dilation h, dilation w
  ivec4 geo;       // C, Kp, m0, rows
  ivec4 ext;       // OW, input packed dim, K, unused
} p;

void main() {
  int k4 = int(gl_GlobalInvocationID.x), r = int(gl_GlobalInvocationID.y);
  if (k4 * 4 >= p.geo.y || r >= p.geo.w) return;
  int m = p.geo.z + r;
  int oh = m / p.ext.x, ow = m % p.ext.x;
  vec4 v = vec4(0.0);
  if (p.geo.x % 4 == 0) {
    // C % 4 == 0: the 4 k share one tap (channels c .. c + 3), so one set of divisions and one bounds test serve all
    int k = k4 * 4, c = k % p.geo.x, tap = k / p.geo.x;
    int ih = oh * p.kern.z - p.pad.x + (tap / p.kern.y) * p.pad.z;
    int iw = ow * p.kern.w - p.pad.y + (tap % p.kern.y) * p.pad.w;
    if (k < p.ext.z && ih >= 0 && ih < p.in_sizes.y && iw >= 0 && iw < p.in_sizes.x)
      for (int l = 0; l < 4; ++l) v[l] = LOAD(t_in, ivec4(iw, ih, c + l, 0), p.in_sizes, p.ext.y);
    scratch4[(r * p.geo.y >> 2) + k4] = to_elem4(v);
    return;
  }
  for (int l = 0; l < 4; ++l) {
    int k = k4 * 4 + l;
    if (k < p.ext.z) {
      int c = k % p.geo.x, tap = k / p.geo.x;
      int ih = oh * p.kern.z - p.pad.x + (tap / p.kern.y) * p.pad.z;
      int iw = ow * p.kern.w - p.pad.y + (tap % p.kern.y) * p.pad.w;
      if (ih >= 0 && ih < p.in_sizes.y && iw >= 0 && iw < p.in_sizes.x)
        v[l] = LOAD(t_in, ivec4(iw, ih, c, 0), p.in_sizes, p.ext.y);
    }
  }
  scratch4[(r * p.geo.y >> 2) + k4] = to_elem4(v);   // one 16-byte (8 at fp16) store, not four scalar ones
}
