#version 450
#extension GL_GOOGLE_include_directive : require
// variants: dtype=float,half
// Row copies with run-time row maps (buffers): for each of R rows of C elements,
//   out[dst_row(r)][c] = src[src_row(r)][c]   for c < cols
// src_row(r): idx[r] (SRC_MODE 0: an int32 index tensor, e.g. token ids, or the rows of a beam reorder),
//   param(sp) + r (1: rows from a run-time offset, e.g. a positional embedding), r (2), param(sp + r) (3: a run-time
//   row each, e.g. the positions of a batch's rows); clamped to [0, src_rows).
// dst_row(r) = (r / G) * DS + param(dp) + r % G, param(dp) read as 0 where dp < 0 (groups of G rows written DS rows
//   apart at a run-time offset: rows of a cache [B, T, D] written at position pos of every b; G = R, DS = 0 for
//   dst_row(r) = r), or param(dp + r / G) where PER (each group at its own offset: each row of a batch at its own
//   position); rows outside [0, dst_rows) are not written.
// cols = min(C, param(cp) * CM) where cp >= 0 (the valid part of each row: the first len positions), else C.
// VEC4: C and CM count vec4 (every row a whole number of vec4).
// Source and destination hold the same element type (ELEM): the half variant copies 16-bit values as they are.
#include "common.glslh"
#include "params.glslh"

layout(constant_id = 3) const bool VEC4 = false;

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM o[]; };
layout(set = 0, binding = 0, std430) writeonly buffer o4_buf { ELEM4 o4[]; };
layout(set = 0, binding = 1, std430) readonly buffer s_buf { ELEM s[]; };
layout(set = 0, binding = 1, std430) readonly buffer s4_buf { ELEM4 s4[]; };
layout(set = 0, binding = 2, std430) readonly buffer i_buf { int idx[]; };
PARAMS_BLOCK(3)

layout(push_constant) uniform Params {
  ivec4 a;   // R, C, src_rows, SRC_MODE
  ivec4 b;   // sp, G, DS, dp
  ivec4 c;   // cp, CM, dst_rows, PER
} p;

void main() {
  const int col = int(gl_GlobalInvocationID.x), r = int(gl_GlobalInvocationID.y);
  const int C = p.a.y;
  const int cols = p.c.x >= 0 ? min(C, param(p.c.x) * p.c.y) : C;
  if (r >= p.a.x || col >= cols) return;
  int sr = p.a.w == 0 ? idx[r] : p.a.w == 1 ? param(p.b.x) + r : p.a.w == 3 ? param(p.b.x + r) : r;
  sr = clamp(sr, 0, p.a.z - 1);
  const int g = r / p.b.y;
  const int dr = g * p.b.z + (p.b.w >= 0 ? param(p.b.w + (p.c.w != 0 ? g : 0)) : 0) + r % p.b.y;
  if (dr < 0 || dr >= p.c.z) return;
  if (VEC4) {
    o4[dr * C + col] = s4[sr * C + col];
  } else {
    o[dr * C + col] = s[sr * C + col];
  }
}
