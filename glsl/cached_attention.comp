#version 450
#extension GL_GOOGLE_include_directive : require
// Attention of a few query rows against a key/value cache (buffers, fp32): out[b, t, head h] = softmax(scale q k^T) v
// over keys 0 .. n-1 of K/V batch row kb (b, or 0 where K and V hold one batch row that every query row shares, as
// cross-attention on an encoder output does).
//   n = min(param(lp) + LOFS + t + 1, Tk) where lp >= 0: causal over a cache that grows, query t sits at position
//       param(lp) + LOFS + t (a run-time parameter: the same recorded dispatch serves every step) and sees the keys
//       up to and including it;
//   n = Tk where lp < 0: every key.
// Layout: q and out [B, Tq, D], k and v [Bk, Tk, D] (rows of D: a cache written a row per position), head h is
// columns h dh .. h dh + dh - 1 (dh = D / H <= NT * ND). One work group per (h, t, b); keys go by in chunks of CH,
// their scores in shared memory, with a running maximum and sum (online softmax); invocation i accumulates output
// columns i, i + NT, ...
#include "common.glslh"
#include "params.glslh"

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { float o[]; };
layout(set = 0, binding = 1, std430) readonly buffer q_buf { float q[]; };
layout(set = 0, binding = 2, std430) readonly buffer k_buf { float k[]; };
layout(set = 0, binding = 3, std430) readonly buffer v_buf { float v[]; };
PARAMS_BLOCK(4)

layout(push_constant) uniform Params {
  ivec4 dims;   // Tq, Tk, H, D
  ivec4 cfg;    // K/V batch rows (1: shared by every query row), lp (-1: every key), LOFS
  vec4 scale;   // x: the score scale
} p;

const int NT = int(gl_WorkGroupSize.x);   // a power of two
const int ND = 2;                         // output columns an invocation accumulates: dh <= NT * ND
const int MAX_DH = 256;
const int CH = 256;                       // keys a chunk

shared float q_sh[MAX_DH];
shared float s_sh[CH];
shared float red_sh[gl_WorkGroupSize.x];

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
  const int h = int(gl_WorkGroupID.x), t = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const int tid = int(gl_LocalInvocationID.x);
  const int Tq = p.dims.x, Tk = p.dims.y, D = p.dims.w, dh = D / p.dims.z;
  const int kb = p.cfg.x > 1 ? b : 0;
  const int n = p.cfg.y >= 0 ? clamp(param(p.cfg.y) + p.cfg.z + t + 1, 0, Tk) : Tk;
  const int qb = (b * Tq + t) * D + h * dh;
  const int kv0 = kb * Tk * D + h * dh;
  for (int d = tid; d < dh; d += NT) q_sh[d] = q[qb + d] * p.scale.x;
  barrier();
  float m = -3.0e38, l = 0.0;
  float acc[ND];
  for (int i = 0; i < ND; ++i) acc[i] = 0.0;
  for (int c0 = 0; c0 < n; c0 += CH) {       // n is uniform: every invocation takes every chunk
    const int cn = min(CH, n - c0);
    float cmax = -3.0e38;
    for (int j = tid; j < cn; j += NT) {
      const int base = kv0 + (c0 + j) * D;
      float sc = 0.0;
      for (int d = 0; d < dh; ++d) sc += q_sh[d] * k[base + d];
      s_sh[j] = sc;
      cmax = max(cmax, sc);
    }
    const float mn = max(m, group_max(cmax));
    const float f = exp(m - mn);
    float csum = 0.0;
    for (int j = tid; j < cn; j += NT) {
      const float e = exp(s_sh[j] - mn);
      s_sh[j] = e;
      csum += e;
    }
    l = l * f + group_sum(csum);              // (its barriers also publish s_sh)
    for (int i = 0; i < ND; ++i) {
      const int d = tid + i * NT;
      if (d < dh) {
        float a = acc[i] * f;
        for (int j = 0; j < cn; ++j) a += s_sh[j] * v[kv0 + (c0 + j) * D + d];
        acc[i] = a;
      }
    }
    m = mn;
    barrier();                                // s_sh is rewritten by the next chunk
  }
  for (int i = 0; i < ND; ++i) {
    const int d = tid + i * NT;
    if (d < dh) o[qb + d] = n > 0 ? acc[i] / l : 0.0;
  }
}
