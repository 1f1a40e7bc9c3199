#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// variants: dtype=float,half io=elem,out32
// exclude: dtype=float io=out32
// exclude: dtype=half io=elem
// TokenSelect (minirt/ops/token_select.py): greedy decoding's choice of the next token from each row of logits
// [N, V], with the suppression of the logit filters as masks, so that the host reads 4 floats a row instead of V.
// A work group a row. Invocation t takes ids t, t + LX, ... in increasing order and keeps running (max, sum of
// exp(x - max), id of the first max) states; a shared-memory tree merges them in a fixed order (the same bits every
// run), the lower id winning ties (numpy's argmax). Suppressed entries are NEG, float32's lowest, as CTranslate2's
// DisableTokens makes them: they never win against a live entry and add exp(NEG - max) = 0 to its sum.
// Three states a row: the raw (unfiltered) row, for the no-speech probability, and the masked row split at
// `begin` into text [0, begin) and timestamps [begin, V), for the timestamp rule's check (where the logsumexp of the
// timestamps beats the largest text logit, text is suppressed) and the final pick over both.
// Output row (float32 at every precision: io=out32): the chosen id, its log-probability in the final row
// (-log of its sum), the raw logit at the no-speech id less the raw maximum, log of the raw sum (0, 0 without one).
#include "common.glslh"

layout(set = 0, binding = 0, std430) writeonly buffer o_buf { OUT_ELEM o[]; };
layout(set = 0, binding = 1, std430) readonly buffer x_buf { ELEM x[]; };
layout(set = 0, binding = 2, std430) readonly buffer bits_buf { uint bits[]; };   // suppressed ids: bit i % 32 of word i / 32
layout(set = 0, binding = 3, std430) readonly buffer ctl_buf { ivec4 ctl[]; };    // 3 a row (token_select.py CONTROL)

layout(push_constant) uniform Params {
  ivec4 dims;   // V, N
} p;

const int LX = int(gl_WorkGroupSize.x);   // a power of two
const int UNROLL = 4;                     // loads in flight an invocation
const float NEG = -3.402823466e38;

shared float m_sh[LX];
shared float s_sh[LX];
shared int i_sh[LX];

struct State { float m; float s; int i; };   // s == 0: no element yet

void add(inout State a, float v, int i) {
  if (a.s == 0.0) {
    a = State(v, 1.0, i);
  } else if (v > a.m) {                 // ids come in increasing order: an equal maximum keeps the earlier id
    a.s = a.s * exp(a.m - v) + 1.0;
    a.m = v;
    a.i = i;
  } else {
    a.s += exp(v - a.m);
  }
}

State merge(State a, State b) {
  if (b.s == 0.0) return a;
  if (a.s == 0.0) return b;
  if (b.m > a.m) return State(b.m, a.s * exp(a.m - b.m) + b.s, b.i);
  return State(a.m, a.s + b.s * exp(b.m - a.m), b.m == a.m ? min(a.i, b.i) : a.i);
}

// The group's merge of every invocation's state, in a fixed order; every invocation must call it (barriers).
State group_merge(State a, int tid) {
  m_sh[tid] = a.m;
  s_sh[tid] = a.s;
  i_sh[tid] = a.i;
  for (int h = LX >> 1; h > 0; h >>= 1) {
    barrier();
    if (tid < h) {
      State r = merge(State(m_sh[tid], s_sh[tid], i_sh[tid]), State(m_sh[tid + h], s_sh[tid + h], i_sh[tid + h]));
      m_sh[tid] = r.m;
      s_sh[tid] = r.s;
      i_sh[tid] = r.i;
    }
  }
  barrier();
  State r = State(m_sh[0], s_sh[0], i_sh[0]);
  barrier();                            // the arrays are rewritten by the next merge
  return r;
}

void main() {
  const int V = p.dims.x, row = int(gl_WorkGroupID.y), tid = int(gl_LocalInvocationID.x);
  const ivec4 ranges = ctl[3 * row], ids = ctl[3 * row + 1], rest = ctl[3 * row + 2];
  const int begin = rest.x, no_speech = rest.z;
  const bool check = rest.y != 0, raw = no_speech >= 0;
  const int base = row * V;
  State r = State(0.0, 0.0, 0), text = State(0.0, 0.0, 0), ts = State(0.0, 0.0, 0);
  for (int i0 = tid; i0 < V; i0 += UNROLL * LX) {
    float v[UNROLL];
    [[unroll]] for (int k = 0; k < UNROLL; ++k) {
      const int i = i0 + k * LX;
      v[k] = i < V ? float(x[base + i]) : 0.0;
    }
    [[unroll]] for (int k = 0; k < UNROLL; ++k) {
      const int i = i0 + k * LX;
      if (i >= V) break;
      if (raw) add(r, v[k], i);
      const bool off = ((bits[i >> 5] >> (i & 31)) & 1u) != 0u || (i >= ranges.x && i < ranges.y) ||
                       (i >= ranges.z && i < ranges.w) || any(equal(ivec4(i), ids));
      const float y = off ? NEG : v[k];
      if (i < begin) add(text, y, i); else add(ts, y, i);
    }
  }
  if (raw) r = group_merge(r, tid);
  text = group_merge(text, tid);
  ts = group_merge(ts, tid);
  if (tid != 0) return;
  // the timestamp rule's check: logsumexp(timestamps) > max(text), both less the row's logsumexp in the host's
  // log-probabilities, which cancels
  if (check && ts.s > 0.0 && text.s > 0.0 && ts.m + log(ts.s) > text.m) text.s = 0.0;
  const State f = merge(text, ts);      // text ids are below timestamp ids: a tie goes to the text maximum
  o[4 * row] = to_out(float(f.i));
  o[4 * row + 1] = to_out(-log(f.s));
  o[4 * row + 2] = to_out(raw ? float(x[base + no_speech]) - r.m : 0.0);
  o[4 * row + 3] = to_out(raw ? log(r.s) : 0.0);
}
