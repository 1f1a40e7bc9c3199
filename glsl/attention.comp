#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: storage=buffer,texture
// Multi-head attention, flash style: out[b, t, h*DH + d] = sum_j softmax_j(scale * q_h[t] . k_h[j]) v_h[j, d],
// q/k/v/out [B, T, D] with head h in columns h*DH .. h*DH + DH - 1 (no head transposes, no score matrix).
// One work group: BQ query rows of one (batch, head), looping over blocks of BK keys with an online
// softmax. Thread (row group g, column group k) owns query rows RT g .. RT g + RT - 1 and
//   scores:  keys k + KG * kk (kk < 4) of the block: an RT x 4 register tile of Q K^T (Q, K in shared memory);
//   output:  vec4 columns k + KG * w (w < CW) of the head: an RT x 4 CW register tile of the accumulator,
// so both products reuse every shared-memory read RT or 4 times. Per block: K -> scores and row-max partials ->
// row max (every thread reduces its own RT rows' partials) -> P = exp2(score - max) to shared memory while V
// is staged -> O = O * alpha + P V. Scores are scaled by scale * log2(e) on staging Q, so
// exp2(s - max) = exp(scale * (x - max x)). fp32 throughout.
#include "common.glslh"

layout(constant_id = 3) const int DH = 64;  // head dim, a multiple of 4
layout(constant_id = 4) const int KG = 16;  // column groups; BK = 4 KG keys per block; DH / 4 = KG * CW
layout(constant_id = 5) const int RT = 4;   // query rows per thread

const int DH4 = DH / 4;
const int P4 = DH4 + 1;                      // shared row pitch in vec4: spreads rows over banks
const int NT = int(gl_WorkGroupSize.x);
const int BQ = RT * NT / KG;                 // query rows per work group
const int BK = 4 * KG;                       // keys per block
const int CW = DH4 / KG;                     // output vec4 columns per thread
const int PP = BK + 4;                       // pitch of P rows, in floats
const float NEG = -1.0e30;                   // running-max start: finite, so exp2(NEG - m) = 0, never NaN

#if defined(STORAGE_TEXTURE)
TENSOR_OUT(t_out, 0)
TENSOR_IN(t_q, 1)
TENSOR_IN(t_k, 2)
TENSOR_IN(t_v, 3)
// [B, T, D] width-packed: texel (column / 4, t, b); DH % 4 == 0, so a head's slice is whole texels.
#define LD(T, b, t, c4, rows) texelFetch(T, ivec3(c4, t, b), 0)
#define ST(b, t, c4, v) imageStore(t_out, ivec3(c4, t, b), v)
#else
// Dense rows of D floats, D % 4 == 0: read and written as vec4.
layout(set = 0, binding = 0, std430) writeonly buffer out_buf { vec4 t_out[]; };
layout(set = 0, binding = 1, std430) readonly buffer q_buf { vec4 t_q[]; };
layout(set = 0, binding = 2, std430) readonly buffer k_buf { vec4 t_k[]; };
layout(set = 0, binding = 3, std430) readonly buffer v_buf { vec4 t_v[]; };
#define LD(T, b, t, c4, rows) T[((b) * (rows) + (t)) * p.dims.w + (c4)]
#define ST(b, t, c4, v) t_out[((b) * p.dims.x + (t)) * p.dims.w + (c4)] = (v)
#endif

layout(push_constant) uniform Params {
  ivec4 dims;   // Tq, Tk, heads, D / 4
  vec4 scale;   // scale * log2(e)
} p;

shared vec4 sq[BQ * P4];      // Q block, pre-scaled
shared vec4 skv[BK * P4];     // K rows of the current block, then its V rows
shared vec4 sp[BQ * PP / 4];  // P = exp2(score - row max), rows of PP floats
shared float sred[BQ * KG];   // per (row, column group): block max partials; at the end, sum partials

// K or V rows j0 .. j0 + BK - 1 of head column c0 into skv; zeros past Tk (masked keys must meet no NaN).
#define STAGE(T, b, j0, c0, Tk) \
  for (int e = int(gl_LocalInvocationID.x); e < BK * DH4; e += NT) { \
    int j_ = e / DH4, c_ = e % DH4; \
    skv[j_ * P4 + c_] = (j0) + j_ < (Tk) ? LD(T, b, (j0) + j_, (c0) + c_, Tk) : vec4(0.0); \
  }

void main() {
  int Tq = p.dims.x, Tk = p.dims.y, H = p.dims.z;
  int tid = int(gl_LocalInvocationID.x);
  int k = tid % KG, r0 = (tid / KG) * RT;    // column group, first of the thread's RT rows
  int q0 = int(gl_WorkGroupID.y) * BQ;
  int b = int(gl_WorkGroupID.z) / H, c0 = (int(gl_WorkGroupID.z) % H) * DH4;

  for (int e = tid; e < BQ * DH4; e += NT) {
    int r = e / DH4, c = e % DH4;
    sq[r * P4 + c] = q0 + r < Tq ? LD(t_q, b, q0 + r, c0 + c, Tq) * p.scale.x : vec4(0.0);
  }

  float m[RT], l[RT];      // running max of the thread's rows; sum of this thread's share of their P
  vec4 o[RT][CW];
  [[unroll]] for (int i = 0; i < RT; ++i) {
    m[i] = NEG;
    l[i] = 0.0;
    [[unroll]] for (int w = 0; w < CW; ++w) o[i][w] = vec4(0.0);
  }

  for (int j0 = 0; j0 < Tk; j0 += BK) {
    barrier();  // the previous block's P and V are fully read
    STAGE(t_k, b, j0, c0, Tk)
    barrier();

    float s[RT][4];  // s[i][kk]: row r0 + i, key k + KG * kk
    [[unroll]] for (int i = 0; i < RT; ++i)
      [[unroll]] for (int kk = 0; kk < 4; ++kk) s[i][kk] = 0.0;
    [[unroll]] for (int d = 0; d < DH4; ++d) {
      vec4 qv[RT], kv[4];
      [[unroll]] for (int i = 0; i < RT; ++i) qv[i] = sq[(r0 + i) * P4 + d];
      [[unroll]] for (int kk = 0; kk < 4; ++kk) kv[kk] = skv[(k + KG * kk) * P4 + d];
      [[unroll]] for (int i = 0; i < RT; ++i)
        [[unroll]] for (int kk = 0; kk < 4; ++kk)
          s[i][kk] = fma(qv[i].w, kv[kk].w, fma(qv[i].z, kv[kk].z,
                                                fma(qv[i].y, kv[kk].y, fma(qv[i].x, kv[kk].x, s[i][kk]))));
    }
    [[unroll]] for (int i = 0; i < RT; ++i) {
      float mx = NEG;
      [[unroll]] for (int kk = 0; kk < 4; ++kk)
        if (j0 + k + KG * kk < Tk) mx = max(mx, s[i][kk]);
      sred[(r0 + i) * KG + k] = mx;
    }
    barrier();  // max partials complete; K is no longer read

    STAGE(t_v, b, j0, c0, Tk)
    [[unroll]] for (int i = 0; i < RT; ++i) {
      float mx = m[i];
      for (int u = 0; u < KG; ++u) mx = max(mx, sred[(r0 + i) * KG + u]);
      float a = exp2(m[i] - mx), sum = 0.0;
      m[i] = mx;
      [[unroll]] for (int kk = 0; kk < 4; ++kk) {
        float pk = j0 + k + KG * kk < Tk ? exp2(s[i][kk] - mx) : 0.0;
        sp[((r0 + i) * PP + k + KG * kk) >> 2][(k + KG * kk) & 3] = pk;
        sum += pk;
      }
      l[i] = l[i] * a + sum;
      [[unroll]] for (int w = 0; w < CW; ++w) o[i][w] *= a;
    }
    barrier();  // P and V complete

    for (int j = 0; j < BK; j += 4) {
      vec4 pv[RT];  // pv[i] = P(row r0 + i, keys j .. j + 3)
      [[unroll]] for (int i = 0; i < RT; ++i) pv[i] = sp[((r0 + i) * PP + j) >> 2];
      [[unroll]] for (int w = 0; w < CW; ++w) {
        int c = k + KG * w;
        vec4 v0 = skv[j * P4 + c], v1 = skv[(j + 1) * P4 + c], v2 = skv[(j + 2) * P4 + c], v3 = skv[(j + 3) * P4 + c];
        [[unroll]] for (int i = 0; i < RT; ++i)
          o[i][w] = fma(vec4(pv[i].w), v3, fma(vec4(pv[i].z), v2,
                                               fma(vec4(pv[i].y), v1, fma(vec4(pv[i].x), v0, o[i][w]))));
      }
    }
  }

  // Row sums: add the column groups' shares, then normalise and store this thread's RT x CW tile.
  barrier();
  [[unroll]] for (int i = 0; i < RT; ++i) sred[(r0 + i) * KG + k] = l[i];
  barrier();
  [[unroll]] for (int i = 0; i < RT; ++i) {
    if (q0 + r0 + i >= Tq) break;
    float sum = 0.0;
    for (int u = 0; u < KG; ++u) sum += sred[(r0 + i) * KG + u];
    [[unroll]] for (int w = 0; w < CW; ++w) ST(b, q0 + r0 + i, c0 + k + KG * w, o[i][w] / sum);
  }
}
