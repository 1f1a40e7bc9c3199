#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Gather copy behind Transpose, Slice, Expand, Gather and reshapes that cannot be views.
// For each output element o (WHCN), the input element it copies is
//   MODE 0 (affine):  in[d] = start[d] + step[d] * o[perm[d]]   (step 0: broadcast or a fixed index)
//   MODE 1 (reshape): the element with the same row-major linear index.
#include "common.glslh"

layout(constant_id = 3) const int MODE = 0;

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 in_sizes;
  ivec4 start;
  ivec4 step;
  ivec4 perm;
  ivec4 pd;  // packed dims of out, in
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
    ivec4 s = MODE == 1 ? unlin(lin(i, p.out_sizes), p.in_sizes)
                        : p.start + p.step * ivec4(i[p.perm.x], i[p.perm.y], i[p.perm.z], i[p.perm.w]);
    r[l] = LOAD(t_in, s, p.in_sizes, p.pd.y);
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
