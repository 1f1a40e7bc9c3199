#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dir=down,up
// precision="fp16" only: a graph input converted to float16 (down), or a float16 result converted to its
// float32 graph output (up). Both sides have the same shape, storage and layout; one invocation per texel.
#define DTYPE_HALF 1
#include "common.glslh"

layout(push_constant) uniform Params {
  ivec4 sizes;   // WHCN
  ivec4 pd;      // packed dim
} p;

#if defined(STORAGE_TEXTURE)
#if defined(DIR_DOWN)
layout(set = 0, binding = 0, rgba16f) uniform writeonly highp image3D t_out;
#else
layout(set = 0, binding = 0, rgba32f) uniform writeonly highp image3D t_out;
#endif
layout(set = 0, binding = 1) uniform highp sampler3D t_in;
#else
#if defined(DIR_DOWN)
layout(set = 0, binding = 0, std430) writeonly buffer o_buf { float16_t t_out[]; };
layout(set = 0, binding = 1, std430) readonly buffer i_buf { float t_in[]; };
#define CONVERT(x) to_elem(x)
#else
layout(set = 0, binding = 0, std430) writeonly buffer o_buf { float t_out[]; };
layout(set = 0, binding = 1, std430) readonly buffer i_buf { float16_t t_in[]; };
#define CONVERT(x) float(x)
#endif
#endif

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.sizes, p.pd.x)) return;
#if defined(STORAGE_TEXTURE)
  imageStore(t_out, pos, sat_elem4(texelFetch(t_in, pos, 0)));   // the image format converts (saturated first)
#else
  ivec4 o = texel_origin(pos, p.sizes, 0);
  int b = lin(o, p.sizes), n = min(p.sizes.x - o.x, 4);
  for (int l = 0; l < n; ++l) t_out[b + l] = CONVERT(t_in[b + l]);
#endif
}
