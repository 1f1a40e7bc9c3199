#version 450
// Occupancy probe for tools/dev/occupancy.py, not a model kernel. Each invocation fills its share of SHARED words of
// shared memory, then follows a chain of ITER dependent shared-memory loads (a pointer chase: latency-bound, and far
// from any throughput limit until dozens of warps share a multiprocessor). A dispatch of G work groups therefore
// takes about ceil(G / (multiprocessors * R)) chain times, where R is how many groups fit on a multiprocessor at
// once; the tool finds R from where that time steps up.
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(constant_id = 3) const int SHARED = 256;   // 32-bit words of shared memory per work group (>= group size)

layout(set = 0, binding = 0, std430) writeonly buffer out_buf { uint t_out[]; };
layout(push_constant) uniform Params { ivec4 n; } p;   // n.x: chain length

shared uint sh[SHARED];

void main() {
  uint nt = gl_WorkGroupSize.x * gl_WorkGroupSize.y * gl_WorkGroupSize.z, tid = gl_LocalInvocationIndex;
  // sh[i] -> i + nt + 1 (mod SHARED): every invocation walks its own cycle through the whole array
  for (uint i = tid; i < uint(SHARED); i += nt) sh[i] = (i + nt + 1u) % uint(SHARED);
  barrier();
  uint at = tid % uint(SHARED);
  for (int i = 0; i < p.n.x; ++i) {
    at = sh[at];
  }
  t_out[gl_WorkGroupID.x * nt + tid] = at;
}
