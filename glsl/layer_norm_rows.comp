#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
// variants: dtype=float,half io=elem,out32
// exclude: dtype=float io=out32
// LayerNormalization over the last dim of a dense buffer whose rows are a multiple of 4 long: one subgroup
// per row, subgroup adds instead of shared-memory trees and barriers. Same numerics as layer_norm.comp:
// two passes over x minus the row's first element (no cancellation for large offsets); huge values as there (a
// row of finite values never gives NaN; every op of the mean's scaled sum is `precise`, as there).
// A work group takes a block of ROWS rows; its subgroups stride over them, so any subgroup size works.
// io=out32 (fp16): the output is a float32 graph output, written as it is.
#include "common.glslh"

layout(constant_id = 3) const bool HAS_BIAS = true;
// Rows of up to REG * subgroup size vec4 (512 floats with 32 lanes: Whisper tiny to base) are read once into
// registers; longer rows stream through the three passes from memory.
const int REG = 4;   // (the mean's sum below is written out for 4)
const float PIVOT_MAX = 5.0706024e30;   // 2^102, as in layer_norm.comp

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { OUT_ELEM4 o[]; };
layout(set = 0, binding = 1, std430) readonly buffer x_buf { ELEM4 x[]; };
layout(set = 0, binding = 2, std430) readonly buffer w_buf { ELEM4 w[]; };  // scale [L4] then bias [L4]

layout(push_constant) uniform Params {
  ivec4 cfg;   // rows, L4 (row length / 4), rows per work group
  vec4 eps;
} p;

void main() {
  int L4 = p.cfg.y;
  float inv_len = 1.0 / float(4 * L4);
  int lane = int(gl_SubgroupInvocationID), width = int(gl_SubgroupSize);
  for (int rr = int(gl_SubgroupID); rr < p.cfg.z; rr += int(gl_NumSubgroups)) {
    int row = int(gl_WorkGroupID.y) * p.cfg.z + rr;
    if (row >= p.cfg.x) break;            // uniform per subgroup: no barriers here
    int base = row * L4;
    float pivot = float(x[base].x);
    if (abs(pivot) >= PIVOT_MAX) pivot = 0.0;
    if (L4 <= REG * width) {
      // The whole row in registers (REG vec4 per lane): one read of x instead of three.
      vec4 v[REG];
      [[unroll]] for (int j = 0; j < REG; ++j) {
        int i = lane + j * width;
        v[j] = i < L4 ? vec4(x[base + i]) - pivot : vec4(0.0);
      }
      // The mean's scaled terms added in one `precise` expression, not in the loop above: spirv-opt's unrolling leaves
      // the copies of a loop body without the NoContraction decoration, and on an H200 such a sum overflowed as if
      // added before scaling. Written for REG = 4.
      precise vec4 s = (v[0] * inv_len + v[1] * inv_len) + (v[2] * inv_len + v[3] * inv_len);
      precise float h = s.x + s.y + s.z + s.w;
      float shift = subgroupAdd(h);
      vec4 q = vec4(0.0);
      [[unroll]] for (int j = 0; j < REG; ++j) {
        vec4 d = v[j] - shift;
        q += lane + j * width < L4 ? d * d : vec4(0.0);
      }
      float rstd = inversesqrt(subgroupAdd(q.x + q.y + q.z + q.w) * inv_len + p.eps.x);
      [[unroll]] for (int j = 0; j < REG; ++j) {
        int i = lane + j * width;
        if (i >= L4) break;
        vec4 y = (rstd == 0.0 ? vec4(0.0) : (v[j] - shift) * rstd) * W4(w, i);
        if (HAS_BIAS) y += W4(w, L4 + i);
        o[base + i] = to_out4(y);
      }
      continue;
    }
    precise vec4 s = vec4(0.0);
    for (int i = lane; i < L4; i += width) s += (vec4(x[base + i]) - pivot) * inv_len;
    precise float h = s.x + s.y + s.z + s.w;
    float shift = subgroupAdd(h);
    vec4 q = vec4(0.0);
    for (int i = lane; i < L4; i += width) {
      vec4 d = (vec4(x[base + i]) - pivot) - shift;
      q += d * d;
    }
    float rstd = inversesqrt(subgroupAdd(q.x + q.y + q.z + q.w) * inv_len + p.eps.x);
    for (int i = lane; i < L4; i += width) {
      vec4 y = (rstd == 0.0 ? vec4(0.0) : ((vec4(x[base + i]) - pivot) - shift) * rstd) * W4(w, i);
      if (HAS_BIAS) y += W4(w, L4 + i);
      o[base + i] = to_out4(y);
    }
  }
}
