#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: dtype=float,half
// Attention of a few query rows against a key/value cache (buffers): out[b, t, head h] = softmax(scale q k^T) v
// over keys 0 .. n-1 of K/V batch row kb (b, or 0 where K and V hold one batch row that every query row shares, as
// cross-attention on an encoder output does, or param(ip - 1 + b) where ip > 0: a run-time map from query rows to K/V
// rows, as a batch of sequences reads each its own encoder output).
//   n = min(param(lp) + LOFS + t + 1, Tk) where lp >= 0: causal over a cache that grows, query t sits at position
//       param(lp) + LOFS + t (a run-time parameter: the same recorded dispatch serves every step) and sees the keys
//       up to and including it;
//   n = Tk where lp < 0: every key;
//   param(lp + b) instead of param(lp) where PER: each batch row at its own position.
// Layout: q and out [B, Tq, D], k and v [Bk, Tk, D] (rows of D: a cache written a row per position), head h is
// columns h DH .. h DH + DH - 1.
// Work: group (h S + s, t, b) takes split s of S of the n keys (S = 1: all of them). Keys go by in chunks of CH: each
// invocation scores one key (a whole DH-wide dot product, unrolled), the chunk's running maximum and sum are kept
// (online softmax), then the NT invocations as KL key lanes by DH / 4 vec4 columns accumulate p v (each key row read
// as DH / 4 contiguous vec4); the KL lanes' sums are added in a fixed order at the end. With S = 1 the group writes
// out; with S > 1 it writes its unnormalised sums and (max in the log2 domain, sum) as attention_combine.comp reads
// them (row ((b H + h) S + s) Tq + t), and that pass merges the splits: a decoder step has few (b, h, t) and many
// keys (1500 of an encoder output), and one group each would leave the GPU nearly idle.
// q, k, v and out are ELEM (the half variant: 16-bit storage, fp32 arithmetic); the partials are fp32 whatever ELEM.
#include "common.glslh"
#include "params.glslh"

layout(constant_id = 3) const int DH = 64;   // head dim, a multiple of 4, at most 4 NT

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM o[]; };
layout(set = 0, binding = 0, std430) writeonly buffer po_buf { float po[]; };     // S > 1: the partials ...
layout(set = 0, binding = 0, std430) writeonly buffer ml_buf { vec2 ml_out[]; };  // ... and their (m, l) pairs
layout(set = 0, binding = 1, std430) readonly buffer q_buf { ELEM q[]; };
layout(set = 0, binding = 2, std430) readonly buffer k_buf { ELEM4 k4[]; };
layout(set = 0, binding = 3, std430) readonly buffer v_buf { ELEM4 v4[]; };
PARAMS_BLOCK(4)

layout(push_constant) uniform Params {
  ivec4 dims;   // Tq, Tk, H, D
  ivec4 cfg;    // K/V batch rows (1: shared by every query row), lp (-1: every key), LOFS, S
  ivec4 part;   // x: where the (m, l) pairs of the partials start (S > 1), in pairs; y: ip (0: none); z: PER
  vec4 scale;   // x: the score scale
} p;

const int NT = int(gl_WorkGroupSize.x);   // a power of two, a multiple of DH / 4
const int DH4 = DH / 4;
const int KL = NT / DH4;                  // key lanes of the p v pass
const int CH = NT;                        // keys a chunk: one an invocation
const float NEG = -3.402823466e38;
const float LOG2E = 1.4426950408889634;

shared vec4 q_sh[DH4];
shared float s_sh[CH];
shared float red_sh[NT];
shared vec4 acc_sh[NT];

float group_max(float x) {
  const int i = int(gl_LocalInvocationID.x);
  red_sh[i] = x;
  for (int h = NT >> 1; h > 0; h >>= 1) {
    barrier();
    if (i < h) red_sh[i] = max(red_sh[i], red_sh[i + h]);
  }
  barrier();
  const float r = red_sh[0];
  barrier();
  return r;
}

float group_sum(float x) {
  const int i = int(gl_LocalInvocationID.x);
  red_sh[i] = x;
  for (int h = NT >> 1; h > 0; h >>= 1) {
    barrier();
    if (i < h) red_sh[i] += red_sh[i + h];
  }
  barrier();
  const float r = red_sh[0];
  barrier();
  return r;
}

void main() {
  const int S = p.cfg.w;
  const int h = int(gl_WorkGroupID.x) / S, s = int(gl_WorkGroupID.x) % S;
  const int t = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const int tid = int(gl_LocalInvocationID.x);
  const int Tq = p.dims.x, Tk = p.dims.y, H = p.dims.z, D = p.dims.w, D4 = D / 4;
  const int kb = p.part.y > 0 ? clamp(param(p.part.y - 1 + b), 0, p.cfg.x - 1) : p.cfg.x > 1 ? b : 0;
  const int n = p.cfg.y >= 0 ? clamp(param(p.cfg.y + (p.part.z != 0 ? b : 0)) + p.cfg.z + t + 1, 0, Tk) : Tk;
  const int per = (n + S - 1) / S;
  const int k0 = min(s * per, n), k1 = min(k0 + per, n);
  const int qb = (b * Tq + t) * D + h * DH;
  const int kv0 = kb * Tk * D4 + h * DH4;           // vec4 index of key 0's head columns
  for (int d4 = tid; d4 < DH4; d4 += NT)
    q_sh[d4] = vec4(float(q[qb + 4 * d4]), float(q[qb + 4 * d4 + 1]), float(q[qb + 4 * d4 + 2]),
                    float(q[qb + 4 * d4 + 3])) * p.scale.x;
  barrier();
  const int c4 = tid % DH4, kl = tid / DH4;
  float m = NEG, l = 0.0;
  vec4 acc = vec4(0.0);
  for (int c0 = k0; c0 < k1; c0 += CH) {       // k0, k1 are uniform: every invocation takes every chunk
    const int cn = min(CH, k1 - c0);
    float sc = NEG;
    if (tid < cn) {
      const int base = kv0 + (c0 + tid) * D4;
      vec4 dot4 = vec4(0.0);
      [[unroll]] for (int d4 = 0; d4 < DH4; ++d4) dot4 += q_sh[d4] * vec4(k4[base + d4]);
      sc = dot4.x + dot4.y + dot4.z + dot4.w;
    }
    const float mn = max(m, group_max(sc));
    const float f = exp(m - mn);
    const float e = tid < cn ? exp(sc - mn) : 0.0;
    s_sh[tid] = e;
    l = l * f + group_sum(e);                  // (its barriers also publish s_sh)
    acc *= f;
    if (kl < KL)                               // (NT need not be a multiple of DH / 4)
      for (int j = kl; j < cn; j += KL) acc += s_sh[j] * vec4(v4[kv0 + (c0 + j) * D4 + c4]);
    m = mn;
    barrier();                                 // s_sh is rewritten by the next chunk
  }
  acc_sh[tid] = acc;
  barrier();
  if (kl == 0) {
    [[unroll]] for (int i = 1; i < KL; ++i) acc += acc_sh[i * DH4 + c4];
    if (S == 1) {
      const vec4 r = l > 0.0 ? acc / l : vec4(0.0);
      const int ob = qb + 4 * c4;
      o[ob] = to_elem(r.x); o[ob + 1] = to_elem(r.y); o[ob + 2] = to_elem(r.z); o[ob + 3] = to_elem(r.w);
    } else {
      const int row = ((b * H + h) * S + s) * Tq + t;
      const int ob = row * DH + 4 * c4;
      po[ob] = acc.x; po[ob + 1] = acc.y; po[ob + 2] = acc.z; po[ob + 3] = acc.w;
      if (c4 == 0) ml_out[p.part.x + row] = vec2(k1 > k0 ? m * LOG2E : NEG, l);
    }
  }
}
