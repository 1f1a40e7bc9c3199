#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: storage=buffer,texture dtype=float,half
// Merges attention_split.comp's S partials (fp32 scratch, layout in attention.glslh) into out [B, Tq, D]:
//   out = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s,  M = max_s m_s  (m is in the log2 domain).
// One invocation per (vec4 column c4, row t, batch b); an empty split (m = NEG, l = 0, O = 0) adds nothing.
#include "common.glslh"

layout(constant_id = 3) const int DH = 64;  // head dim, a multiple of 4
const int DH4 = DH / 4;
const int FAST_S = 4;   // up to this many splits, all loads first (the same sums in the same order)
const float NEG = -3.402823466e38;   // attention.glslh's running-max start: an empty split's m

layout(push_constant) uniform Params {
  ivec4 dims;   // Tq, heads, D / 4, S
  ivec4 base;   // B, ml_base (index of the first (m, l) pair in t_ml), 1: a row with l = 0 everywhere gives 0, not NaN
  ivec4 stream; // STREAM (attention.glslh): G work groups, BQ query rows a block, nb key blocks; G = 0: plain splits
} p;

#if defined(STORAGE_TEXTURE)
TENSOR_OUT(t_out, 0)
#define ST(b, t, c4, v) imageStore(t_out, ivec3(c4, t, b), v)
#else
layout(set = 0, binding = 0, std430) writeonly buffer out_buf { ELEM4 t_out[]; };
#define ST(b, t, c4, v) t_out[((b) * p.dims.x + (t)) * p.dims.z + (c4)] = to_elem4(v)
#endif
layout(set = 0, binding = 1, std430) readonly buffer po_buf { vec4 t_po[]; };
layout(set = 0, binding = 1, std430) readonly buffer ml_buf { vec2 t_ml[]; };

void main() {
  int Tq = p.dims.x, H = p.dims.y, D4 = p.dims.z, S = p.dims.w;
  int c4 = int(gl_GlobalInvocationID.x), t = int(gl_GlobalInvocationID.y), b = int(gl_GlobalInvocationID.z);
  if (c4 >= D4 || t >= Tq || b >= p.base.x) return;
  int r0 = (b * H + c4 / DH4) * S * Tq + t;   // row of split 0; split s is row r0 + s Tq
  if (p.stream.x > 0) {
    // the slots of this row's query block: one per work group whose range held some of its key blocks
    const int G = p.stream.x, nb = p.stream.z, QB = (Tq + p.stream.y - 1) / p.stream.y, U = p.base.x * H * QB * nb;
    const int seg = (b * H + c4 / DH4) * QB + t / p.stream.y;
    S = ((seg * nb + nb) * G - 1) / U - ((seg * nb + 1) * G - 1) / U + 1;
  }
  float mx = NEG;
  float den = 0.0;
  vec4 acc = vec4(0.0);
  if (S <= FAST_S) {
    // every split's (m, l) and O loaded before any is used: one memory round trip (predicated loads)
    vec2 ml[FAST_S];
    vec4 o[FAST_S];
    [[unroll]] for (int s = 0; s < FAST_S; ++s) {
      ml[s] = s < S ? t_ml[p.base.y + r0 + s * Tq] : vec2(NEG, 0.0);
      o[s] = s < S ? t_po[(r0 + s * Tq) * DH4 + c4 % DH4] : vec4(0.0);
    }
    [[unroll]] for (int s = 0; s < FAST_S; ++s)
      if (s < S) mx = max(mx, ml[s].x);
    [[unroll]] for (int s = 0; s < FAST_S; ++s)
      if (s < S) {
        float w = exp2(ml[s].x - mx);
        den += w * ml[s].y;
        acc += w * o[s];
      }
  } else {
    for (int s = 0; s < S; ++s) mx = max(mx, t_ml[p.base.y + r0 + s * Tq].x);
    for (int s = 0; s < S; ++s) {
      vec2 ml = t_ml[p.base.y + r0 + s * Tq];
      float w = exp2(ml.x - mx);
      den += w * ml.y;
      acc += w * t_po[(r0 + s * Tq) * DH4 + c4 % DH4];
    }
  }
  if (den == 0.0 && p.base.z != 0) den = INF_F;   // a fully masked row (attention.glslh MASK): acc is 0
  ST(b, t, c4, acc / den);
}
