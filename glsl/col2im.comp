#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// ConvTranspose's gather (minirt/ops/conv_transpose.py): output [N, C_out, OH, OW] from the GEMM's columns
// [G * N * H, W, C_out / G * KH * KW] (row (g * N + n) * H + ih, column iw, (channel in group, kh, kw)). Each
// invocation writes one output texel, 4 neighbours along the output's packed dim; each lane adds to its bias the
// columns of every (input position, tap) that lands on it, in tap order, so every run gives the same bits.
#include "common.glslh"

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_cols, 1)
layout(set = 0, binding = 2, std430) readonly buffer b_buf { ELEM bias[]; };

layout(push_constant) uniform Params {
  ivec4 out_sizes;   // WHCN of the output [N, C_out, OH, OW]
  ivec4 col_sizes;   // WHCN of the columns
  ivec4 kern;        // KH, KW, stride h, stride w
  ivec4 pad;         // pad top, pad left, dilation h, dilation w
  ivec4 geo;         // input H, input W, output channels per group, N
  ivec4 pd;          // packed dims of out, columns
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
    int g = i.z / p.geo.z, oc = i.z % p.geo.z;
    int row0 = (g * p.geo.w + i.w) * p.geo.x;
    float acc = float(bias[i.z]);
    for (int kh = 0; kh < p.kern.x; ++kh) {
      int th = i.y + p.pad.x - kh * p.pad.z;     // ih * stride h, where a tap lands here
      if (th < 0 || th % p.kern.z != 0 || th / p.kern.z >= p.geo.x) continue;
      int row = row0 + th / p.kern.z;
      for (int kw = 0; kw < p.kern.y; ++kw) {
        int tw = i.x + p.pad.y - kw * p.pad.w;
        if (tw < 0 || tw % p.kern.w != 0 || tw / p.kern.w >= p.geo.y) continue;
        acc += LOAD(t_cols, ivec4((oc * p.kern.x + kh) * p.kern.y + kw, tw / p.kern.w, row, 0), p.col_sizes, p.pd.y);
      }
    }
    r[l] = acc;
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
