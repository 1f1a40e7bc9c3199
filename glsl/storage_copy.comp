#version 450
#extension GL_GOOGLE_include_directive : require
// variants: dir=b2t,t2b dtype=float,half
// Mixed storage (storage="auto" where a tensor is too large for the device's images; minirt/planner/
// storage_layout.py): a tensor copied from a dense row-major buffer into a texture (b2t) or back (t2b), both of
// the same shape and element type. One invocation per texel of the texture, 4 neighbours along its packed dim;
// the texture's lanes past the end of that dim are written as 0, as the host's uploads write them.
#include "common.glslh"

layout(push_constant) uniform Params {
  ivec4 sizes;  // WHCN
  ivec4 pd;     // the texture's packed dim
} p;

#if defined(DIR_B2T)
layout(set = 0, binding = 0, IMG_FMT) uniform writeonly highp image3D t_out;
layout(set = 0, binding = 1, std430) readonly buffer i_buf { ELEM t_in[]; };
#else
layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM t_out[]; };
layout(set = 0, binding = 1) uniform highp sampler3D t_in;
#endif

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.sizes, p.pd.x)) return;
  ivec4 o = texel_origin(pos, p.sizes, p.pd.x);
#if defined(DIR_B2T)
  vec4 v = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] < p.sizes[p.pd.x]) v[l] = float(t_in[lin(i, p.sizes)]);
  }
  imageStore(t_out, pos, v);
#else
  vec4 v = texelFetch(t_in, pos, 0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] < p.sizes[p.pd.x]) t_out[lin(i, p.sizes)] = to_elem(v[l]);
  }
#endif
}
