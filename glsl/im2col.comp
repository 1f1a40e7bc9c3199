#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half io=elem,in32
// exclude: dtype=float io=in32
// exclude: storage=texture io=in32
// im2col for a 2-D conv: scratch[r, k] = input at output position m0 + r, tap and channel k,
// with k ordered (kh, kw, c) so 4 consecutive k of a channels-packed texture share one tap; zero where
// the tap falls in the padding. The scratch is a plain buffer [rows, Kp] (Kp = K rounded up to 4) in
// both storages; the GEMM reads it as A. io=in32 (fp16, buffers): the input is a float32 graph input, read as
// it is (in textures the sampler converts, so they need no such variant).
// Positions run over one image (ext.w 0: the input is one image, [1, C, H, W]) or over a batch (ext.w = OH * OW, the
// positions of an image: position m is image m / (OH * OW)). IN_NHWC (buffers): the input is channels-last
// [N, H, W, C] (planner/conv_channels_last.py), so a tap's 4 channels are one 16-byte (8 at fp16) load.
#include "common.glslh"

layout(constant_id = 3) const bool IN_NHWC = false;

#if defined(IO_IN32)
#define IN_ELEM4 vec4
#else
#define IN_ELEM4 ELEM4
#endif

layout(set = 0, binding = 0, std430) writeonly buffer s_buf { ELEM4 scratch4[]; };   // rows of Kp, Kp % 4 == 0
TENSOR_IN(t_in, 1)
#if !defined(STORAGE_TEXTURE)
layout(set = 0, binding = 1, std430) readonly buffer in4_buf { IN_ELEM4 t_in4[]; };  // IN_NHWC's channel runs
#endif

layout(push_constant) uniform Params {
  ivec4 in_sizes;  // WHCN of the input: of [N, C, H, W], or (IN_NHWC) of [N, H, W, C], i.e. (C, W, H, N)
  ivec4 kern;      // KH, KW, stride h, stride w
  ivec4 pad;       // pad top, pad left, dilation h, dilation w
  ivec4 geo;       // C, Kp, m0, rows
  ivec4 ext;       // OW, input packed dim, K, positions an image (0: one image)
} p;

float load_in(int n, int c, int ih, int iw) {
  return IN_NHWC ? LOAD(t_in, ivec4(c, iw, ih, n), p.in_sizes, 0) : LOAD(t_in, ivec4(iw, ih, c, n), p.in_sizes, p.ext.y);
}

void main() {
  int k4 = int(gl_GlobalInvocationID.x), r = int(gl_GlobalInvocationID.y);
  if (k4 * 4 >= p.geo.y || r >= p.geo.w) return;
  int m = p.geo.z + r;
  const int n = p.ext.w > 0 ? m / p.ext.w : 0;
  m -= n * p.ext.w;
  const int H = IN_NHWC ? p.in_sizes.z : p.in_sizes.y, W = IN_NHWC ? p.in_sizes.y : p.in_sizes.x;
  int oh = m / p.ext.x, ow = m % p.ext.x;
  vec4 v = vec4(0.0);
  if (p.geo.x % 4 == 0) {
    // C % 4 == 0: the 4 k share one tap (channels c .. c + 3), so one set of divisions and one bounds test serve all
    int k = k4 * 4, c = k % p.geo.x, tap = k / p.geo.x;
    int ih = oh * p.kern.z - p.pad.x + (tap / p.kern.y) * p.pad.z;
    int iw = ow * p.kern.w - p.pad.y + (tap % p.kern.y) * p.pad.w;
    if (k < p.ext.z && ih >= 0 && ih < H && iw >= 0 && iw < W) {
#if !defined(STORAGE_TEXTURE)
      if (IN_NHWC) {
        v = vec4(t_in4[(((n * H + ih) * W + iw) * p.geo.x + c) >> 2]);
      } else
#endif
      for (int l = 0; l < 4; ++l) v[l] = load_in(n, c + l, ih, iw);
    }
    scratch4[(r * p.geo.y >> 2) + k4] = to_elem4(v);
    return;
  }
  for (int l = 0; l < 4; ++l) {
    int k = k4 * 4 + l;
    if (k < p.ext.z) {
      int c = k % p.geo.x, tap = k / p.geo.x;
      int ih = oh * p.kern.z - p.pad.x + (tap / p.kern.y) * p.pad.z;
      int iw = ow * p.kern.w - p.pad.y + (tap % p.kern.y) * p.pad.w;
      if (ih >= 0 && ih < H && iw >= 0 && iw < W) v[l] = load_in(n, c, ih, iw);
    }
  }
  scratch4[(r * p.geo.y >> 2) + k4] = to_elem4(v);   // one 16-byte (8 at fp16) store, not four scalar ones
}
