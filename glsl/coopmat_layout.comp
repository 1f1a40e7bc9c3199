#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
// Where a device keeps the elements of 16 x 16 cooperative matrices, for minirt/vk/coopmat_probe.py (not a model
// kernel). KHR leaves the element-to-lane mapping to the implementation; kernels that index accumulator elements
// (the register softmax of attention_cm.comp, layout=mma) may run only where this probe shows the mapping they assume.
// One subgroup loads an A (f16), a B (f16) and an accumulator (f32) matrix from row-major values r * 16 + c and writes
// t_out[(m * 32 + lane) * 16 + i] = element i of matrix m in that lane (all ones where i >= length()), then the three
// lengths at t_out[3 * 512 ..].
layout(local_size_x = 32) in;

layout(set = 0, binding = 0, std430) writeonly buffer out_buf { uint t_out[]; };

shared float16_t sh[256];
shared float sf[256];

void main() {
  uint lane = gl_LocalInvocationID.x;
  for (uint e = lane; e < 256u; e += 32u) {
    sh[e] = float16_t(e);   // exact: fp16 holds every integer up to 2048
    sf[e] = float(e);
  }
  for (uint e = lane; e < 3u * 512u; e += 32u) t_out[e] = 0xFFFFFFFFu;
  barrier();
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c;
  coopMatLoad(a, sh, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(b, sh, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(c, sf, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  for (int i = 0; i < a.length() && i < 16; ++i) t_out[lane * 16u + uint(i)] = uint(a[i]);
  for (int i = 0; i < b.length() && i < 16; ++i) t_out[(32u + lane) * 16u + uint(i)] = uint(b[i]);
  for (int i = 0; i < c.length() && i < 16; ++i) t_out[(64u + lane) * 16u + uint(i)] = uint(c[i]);
  if (lane == 0u) {
    t_out[3u * 512u] = uint(a.length());
    t_out[3u * 512u + 1u] = uint(b.length());
    t_out[3u * 512u + 2u] = uint(c.length());
  }
}
