#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: dtype=float,half
// cached_attention.comp over every key (no causal length) for up to R query rows a work group that read the same K/V
// batch row: each key and value row is read once for all of them instead of once a row (a decoder step's beams, or a
// prompt's tokens, reading one encoder output). Query rows are taken flat, r = b Tq + t (q and out [B, Tq, D]);
// K/V row kb(b) of query batch row b is b, 0 where K and V hold one batch row, or param(ip - 1 + b) where ip > 0.
// Which rows a work group (h S + s, y, z) takes:
//   ip = 0 (known when planning): runs of L consecutive rows share a K/V row (L = B Tq where K and V hold one batch
//     row, else Tq); group (y, z) takes rows z L + y R .. z L + y R + R - 1 of run z, fewer at the run's end.
//   ip > 0 (the map is written by the host before each run): a group a row r (y = t, z = b), as cached_attention.comp
//     has; the rows of consecutive batch rows with the same K/V row form a run, the group of the run's row i R takes
//     rows i R .. i R + R - 1 of it (fewer at the run's end) and the others return at once. Rows of one K/V row that
//     do not lie together are not grouped, and stay correct: a group never mixes K/V rows.
// Per row everything is done as cached_attention.comp does it, in the same order (the same scores, chunk maxima and
// sums, p v sums and key-lane sums): each invocation scores its key against the R rows' queries (the key row loaded
// once), the R rows' reductions run side by side, and the p v pass adds each value vec4 it loads into R sums.
// Key splits and their partials as there (row ((b H + h) S + s) Tq + t), merged by attention_combine.comp.
#include "common.glslh"
#include "params.glslh"

layout(constant_id = 3) const int DH = 64;   // head dim, a multiple of 4, at most 4 NT
layout(constant_id = 4) const int R = 8;     // query rows a work group at most

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { ELEM o[]; };
layout(set = 0, binding = 0, std430) writeonly buffer po_buf { float po[]; };     // S > 1: the partials ...
layout(set = 0, binding = 0, std430) writeonly buffer ml_buf { vec2 ml_out[]; };  // ... and their (m, l) pairs
layout(set = 0, binding = 1, std430) readonly buffer q_buf { ELEM q[]; };
layout(set = 0, binding = 2, std430) readonly buffer k_buf { ELEM4 k4[]; };
layout(set = 0, binding = 3, std430) readonly buffer v_buf { ELEM4 v4[]; };
PARAMS_BLOCK(4)

layout(push_constant) uniform Params {
  ivec4 dims;   // Tq, Tk, H, D
  ivec4 cfg;    // K/V batch rows (1: shared by every query row), B (q's batch rows), L (ip = 0: rows a run), S
  ivec4 part;   // x: where the (m, l) pairs of the partials start (S > 1), in pairs; y: ip (0: none)
  vec4 scale;   // x: the score scale
} p;

const int NT = int(gl_WorkGroupSize.x);   // a power of two, a multiple of DH / 4
const int DH4 = DH / 4;
const int KL = NT / DH4;                  // key lanes of the p v pass
const int CH = NT;                        // keys a chunk: one an invocation
const float NEG = -3.402823466e38;
const float LOG2E = 1.4426950408889634;

shared vec4 q_sh[R * DH4];
shared float s_sh[R * CH];
shared float red_sh[R * NT];
shared vec4 acc_sh[NT];

int kv_row(int b) {
  return p.part.y > 0 ? clamp(param(p.part.y - 1 + b), 0, p.cfg.x - 1) : p.cfg.x > 1 ? b : 0;
}

void main() {
  const int S = p.cfg.w;
  const int h = int(gl_WorkGroupID.x) / S, s = int(gl_WorkGroupID.x) % S;
  const int tid = int(gl_LocalInvocationID.x);
  const int Tq = p.dims.x, Tk = p.dims.y, H = p.dims.z, D = p.dims.w, D4 = D / 4;
  int r0, cnt, kb;      // this group's rows r0 .. r0 + cnt - 1, all reading K/V row kb (uniform)
  if (p.part.y > 0) {
    const int t = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
    kb = kv_row(b);
    int b0 = b, b1 = b + 1;                    // the run of batch rows b0 .. b1 - 1 reading kb
    while (b0 > 0 && kv_row(b0 - 1) == kb) --b0;
    while (b1 < p.cfg.y && kv_row(b1) == kb) ++b1;
    r0 = b * Tq + t;
    if ((r0 - b0 * Tq) % R != 0) return;      // a row another group of the run takes (the whole group returns)
    cnt = min(R, b1 * Tq - r0);
  } else {
    const int L = p.cfg.z, y = int(gl_WorkGroupID.y);
    r0 = int(gl_WorkGroupID.z) * L + y * R;
    cnt = min(R, L - y * R);
    kb = kv_row(r0 / Tq);
  }
  const int per = (Tk + S - 1) / S;
  const int k0 = min(s * per, Tk), k1 = min(k0 + per, Tk);
  const int kv0 = kb * Tk * D4 + h * DH4;           // vec4 index of key 0's head columns
  for (int i = tid; i < R * DH4; i += NT) {
    const int r = i / DH4, qb = (r0 + r) * D + h * DH + 4 * (i % DH4);
    q_sh[i] = r < cnt ? vec4(float(q[qb]), float(q[qb + 1]), float(q[qb + 2]), float(q[qb + 3])) * p.scale.x
                      : vec4(0.0);
  }
  barrier();
  const int c4 = tid % DH4, kl = tid / DH4;
  float m[R], l[R];
  vec4 acc[R];
  [[unroll]] for (int r = 0; r < R; ++r) { m[r] = NEG; l[r] = 0.0; acc[r] = vec4(0.0); }
  for (int c0 = k0; c0 < k1; c0 += CH) {       // k0, k1 are uniform: every invocation takes every chunk
    const int cn = min(CH, k1 - c0);
    float sc[R];
    [[unroll]] for (int r = 0; r < R; ++r) sc[r] = NEG;
    if (tid < cn) {
      const int base = kv0 + (c0 + tid) * D4;
      vec4 dot4[R];
      [[unroll]] for (int r = 0; r < R; ++r) dot4[r] = vec4(0.0);
      [[unroll]] for (int d4 = 0; d4 < DH4; ++d4) {
        const vec4 kk = vec4(k4[base + d4]);
        [[unroll]] for (int r = 0; r < R; ++r)
          if (r < cnt) dot4[r] += q_sh[r * DH4 + d4] * kk;
      }
      [[unroll]] for (int r = 0; r < R; ++r) sc[r] = dot4[r].x + dot4[r].y + dot4[r].z + dot4[r].w;
    }
    // the R rows' chunk maxima, then their sums: cached_attention.comp's tree reductions, side by side
    [[unroll]] for (int r = 0; r < R; ++r) red_sh[r * NT + tid] = sc[r];
    for (int w = NT >> 1; w > 0; w >>= 1) {
      barrier();
      if (tid < w)
        [[unroll]] for (int r = 0; r < R; ++r)
          if (r < cnt) red_sh[r * NT + tid] = max(red_sh[r * NT + tid], red_sh[r * NT + tid + w]);
    }
    barrier();
    float mn[R], f[R];
    [[unroll]] for (int r = 0; r < R; ++r) {
      mn[r] = max(m[r], red_sh[r * NT]);
      f[r] = exp(m[r] - mn[r]);
    }
    barrier();
    [[unroll]] for (int r = 0; r < R; ++r) {
      const float e = tid < cn ? exp(sc[r] - mn[r]) : 0.0;
      s_sh[r * CH + tid] = e;
      red_sh[r * NT + tid] = e;
    }
    for (int w = NT >> 1; w > 0; w >>= 1) {
      barrier();
      if (tid < w)
        [[unroll]] for (int r = 0; r < R; ++r)
          if (r < cnt) red_sh[r * NT + tid] += red_sh[r * NT + tid + w];
    }
    barrier();                                 // (also publishes s_sh)
    [[unroll]] for (int r = 0; r < R; ++r) {
      l[r] = l[r] * f[r] + red_sh[r * NT];
      acc[r] *= f[r];
      m[r] = mn[r];
    }
    if (kl < KL)                               // (NT need not be a multiple of DH / 4)
      for (int j = kl; j < cn; j += KL) {
        const vec4 vv = vec4(v4[kv0 + (c0 + j) * D4 + c4]);
        [[unroll]] for (int r = 0; r < R; ++r)
          if (r < cnt) acc[r] += s_sh[r * CH + j] * vv;
      }
    barrier();                                 // s_sh and red_sh are rewritten by the next chunk
  }
  [[unroll]] for (int r = 0; r < R; ++r) {
    if (r >= cnt) break;                       // (uniform)
    acc_sh[tid] = acc[r];
    barrier();
    if (kl == 0) {
      vec4 a = acc[r];
      [[unroll]] for (int i = 1; i < KL; ++i) a += acc_sh[i * DH4 + c4];
      if (S == 1) {
        const vec4 v = l[r] > 0.0 ? a / l[r] : vec4(0.0);
        const int ob = (r0 + r) * D + h * DH + 4 * c4;
        o[ob] = to_elem(v.x); o[ob + 1] = to_elem(v.y); o[ob + 2] = to_elem(v.z); o[ob + 3] = to_elem(v.w);
      } else {
        const int b = (r0 + r) / Tq, t = (r0 + r) % Tq;
        const int row = ((b * H + h) * S + s) * Tq + t;
        const int ob = row * DH + 4 * c4;
        po[ob] = a.x; po[ob + 1] = a.y; po[ob + 2] = a.z; po[ob + 3] = a.w;
        if (c4 == 0) ml_out[p.part.x + row] = vec2(k1 > k0 ? m[r] * LOG2E : NEG, l[r]);
      }
    }
    barrier();                                 // acc_sh is rewritten for the next row
  }
}
