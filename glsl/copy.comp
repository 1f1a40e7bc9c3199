#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Gather copy behind Transpose, Slice, Expand, Gather, Pad and reshapes that cannot be views.
// For each output element o (WHCN), the input element it copies is
//   MODE 0 (affine):  in[d] = start[d] + step[d] * o[perm[d]]   (step 0: broadcast or a fixed index)
//   MODE 1 (reshape): the element with the same row-major linear index.
//   MODE 2 (pad):     in[d] = start[d] + o[d] (start: minus the leading pad), an index outside the input mapped by
//                     the pad mode pd.z: 0 constant (the element is value.x), 1 reflect, 2 edge, 3 wrap.
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
  ivec4 pd;  // packed dims of out, in; pad mode
  vec4 value;  // pad: the constant (MODE 2 only: other modes push no more than pd)
} p;

// An index outside [0, n) mapped into it by pad mode `mode` (1 reflect, 2 edge, 3 wrap); -1 for constant padding.
int pad_index(int i, int n, int mode) {
  if (i >= 0 && i < n) return i;
  if (mode == 0) return -1;
  if (mode == 2 || n == 1) return clamp(i, 0, n - 1);
  if (mode == 3) return ((i % n) + n) % n;
  int period = 2 * (n - 1);
  i = ((i % period) + period) % period;
  return i < n ? i : period - i;
}

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.out_sizes, p.pd.x)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, p.pd.x);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] >= p.out_sizes[p.pd.x]) break;
    if (MODE == 2) {
      ivec4 s = p.start + i;
      ivec4 m = ivec4(pad_index(s.x, p.in_sizes.x, p.pd.z), pad_index(s.y, p.in_sizes.y, p.pd.z),
                      pad_index(s.z, p.in_sizes.z, p.pd.z), pad_index(s.w, p.in_sizes.w, p.pd.z));
      r[l] = any(lessThan(m, ivec4(0))) ? p.value.x : LOAD(t_in, m, p.in_sizes, p.pd.y);
      continue;
    }
    ivec4 s = MODE == 1 ? unlin(lin(i, p.out_sizes), p.in_sizes)
                        : p.start + p.step * ivec4(i[p.perm.x], i[p.perm.y], i[p.perm.z], i[p.perm.w]);
    r[l] = LOAD(t_in, s, p.in_sizes, p.pd.y);
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
