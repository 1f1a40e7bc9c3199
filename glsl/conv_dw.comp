#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Depthwise 2-D conv (groups == channels, one filter per channel): each invocation writes one output
// texel, 4 neighbours along the output's packed dim; each lane reads only its own channel.
#include "common.glslh"

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)
layout(set = 0, binding = 2, std430) readonly buffer w_buf { ELEM w[]; };  // [C][KH][KW]
layout(set = 0, binding = 3, std430) readonly buffer b_buf { ELEM bias[]; };

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 in_sizes;
  ivec4 kern;   // KH, KW, stride h, stride w
  ivec4 pad;    // pad top, pad left, dilation h, dilation w
  ivec4 pd;     // packed dims of out, in; activation (ACT_* of activation.glslh)
} p;

#define ACT p.pd.z
#include "activation.glslh"

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.out_sizes, p.pd.x)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, p.pd.x);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] >= p.out_sizes[p.pd.x]) break;
    int c = i.z;
    float s = float(bias[c]);
    for (int kh = 0; kh < p.kern.x; ++kh) {
      int ih = i.y * p.kern.z - p.pad.x + kh * p.pad.z;
      if (ih < 0 || ih >= p.in_sizes.y) continue;
      for (int kw = 0; kw < p.kern.y; ++kw) {
        int iw = i.x * p.kern.w - p.pad.y + kw * p.pad.w;
        if (iw < 0 || iw >= p.in_sizes.x) continue;
        s += float(w[(c * p.kern.x + kh) * p.kern.y + kw]) * LOAD(t_in, ivec4(iw, ih, c, i.w), p.in_sizes, p.pd.y);
      }
    }
    r[l] = activate(s);
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
