#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Concat of up to 4 inputs along one WHCN axis. Unused binding slots repeat input 0; they are never read.
#include "common.glslh"

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in0, 1)
TENSOR_IN(t_in1, 2)
TENSOR_IN(t_in2, 3)
TENSOR_IN(t_in3, 4)

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 in_sizes[4];
  ivec4 in_pd;  // packed dims of the inputs
  ivec4 info;   // out packed dim, concat axis (WHCN), number of inputs
} p;

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  int pd = p.info.x, axis = p.info.y;
  if (!texel_in_range(pos, p.out_sizes, pd)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, pd);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[pd] += l;
    if (i[pd] >= p.out_sizes[pd]) break;
    int k = 0;  // which input holds i: walk past the earlier ones along the axis
    while (k < p.info.z - 1 && i[axis] >= p.in_sizes[k][axis]) {
      i[axis] -= p.in_sizes[k][axis];
      ++k;
    }
    ivec4 s = p.in_sizes[k];
    if (k == 0) r[l] = LOAD(t_in0, i, s, p.in_pd.x);
    else if (k == 1) r[l] = LOAD(t_in1, i, s, p.in_pd.y);
    else if (k == 2) r[l] = LOAD(t_in2, i, s, p.in_pd.z);
    else r[l] = LOAD(t_in3, i, s, p.in_pd.w);
  }
  STORE4(t_out, o, p.out_sizes, pd, r);
}
