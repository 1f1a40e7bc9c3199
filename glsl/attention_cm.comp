#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
// variants: impl=khr,emu dtype=half
// Multi-head attention on VK_KHR_cooperative_matrix (f16 x f16 -> f32, subgroup scope, 16 x 16 x 16), the same
// semantics as attention.comp: out[b, t, h*DH + d] = sum_j softmax_j(scale * q_h[t] . k_h[j]) v_h[j, d] with
// q/k/v/out [B, T, D] float16 buffers, head h in columns h*DH .. h*DH + DH - 1, keys past Tk masked.
//
// A work group owns BQ = 16 NR query rows of one (batch, head) and runs NS = NR KS teams of 32 invocations
// (one subgroup each): team (rt, ks) owns query rows 16 rt .. 16 rt + 15 of the group and the key blocks
// ks, ks + KS, ks + 2 KS, ... of BK keys. Each key split stages its K and V blocks in shared memory (one block
// ahead in registers) and its NR teams share them. Per block, a team
//   S = Q K^T      cooperative matrices: Q (16 x DH, fp16, loaded once) times K^T (column-major view of K rows);
//                  S (fp32) goes to the team's area of shared memory;
//   softmax        lane (r, half) = (lane % 16, lane / 16) takes row r, keys half * BK/2 ..: t = s * scale * log2 e
//                  in fp32, the block's row max (lane pair via shuffle), P = exp2(t - m) to the area as fp16;
//   O += P V       cooperative matrices into DH / 16 fp32 accumulators that stay in registers.
// Lazy rescaling: KHR cooperative matrices have no per-row scaling, so a row keeps a stale max m and P is taken
// against it; only when some row of the team sees t > m + RESCALE_LOG2 (P could exceed 2^RESCALE_LOG2) does the
// team move its maxima and scale its O rows through shared memory. P stays <= 2^RESCALE_LOG2 (fine in fp16), and
// the row sum l uses the same stale max, so O / l is exact. At the end the key splits are merged through shared
// memory (weights exp2(m_split - max m)) and O / l is stored as fp16 (saturating, as every _half kernel).
//
// Shared memory (48 KiB per multiprocessor on NVIDIA's driver, so every KiB decides how many groups run at once): a
// split's K and V rows (fp16) and one area per team of 16 rows x AP uvec4, which holds in turn the team's Q rows (fp16,
// before the loop), S (fp32), P (fp16, packed two to a uint: beside S where the row has room, else over it once every
// lane has read it) and O tiles on their way through (rescaling, the final merge). One area instead of separate Q, S
// and P arrays is what brings the (4, 1, 16) tile to 14 KiB, 3 groups per H200 multiprocessor.
//
// SPLIT (flash decoding across work groups): work group z = (b * H + h) * S + s takes key blocks [s nb / S, (s + 1)
// nb / S) of the nb = ceil(Tk / BK) and writes its unnormalised O rows (fp32) and per row (m, l) to a scratch
// buffer in attention.glslh's layout, which attention_combine.comp merges: more, shorter-running groups where one
// per (query block, head) would leave multiprocessors idle.
//
// impl=emu: the same kernel with the matrix operations done by plain code on the same data (each team's 16 x 16
// tiles exchanged through shared memory, every team sync a work group barrier). It runs on devices without
// cooperative matrices (slowly) so that tests can check everything except the matrix instructions themselves.
#if defined(IMPL_KHR)
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#endif
#include "common.glslh"

layout(constant_id = 3) const int DH = 64;  // head dim, a multiple of 16
layout(constant_id = 4) const int NR = 2;   // row teams: BQ = 16 NR query rows per work group
layout(constant_id = 5) const int KS = 2;   // key splits; the work group has NS = NR KS teams of 32 invocations
layout(constant_id = 6) const int BK = 32;  // keys per block, a multiple of 16
layout(constant_id = 7) const bool SPLIT = false;  // write partials for attention_combine.comp (see above)

const int NS = NR * KS;
const int BQ = 16 * NR;
const int DH4 = DH / 4;
const int DT = DH / 16;           // 16-column tiles of the head
const int KT = BK / 16;           // 16-key tiles of a block
const int KP4 = DH4 + 2;          // K/V row pitch in f16vec4: DH + 8 halves, no bank conflicts
const int SP4 = BK / 4 + 1;       // S row pitch in the team area, in uvec4 (BK + 4 floats)
const int QP = DH / 8 + 1;        // Q row pitch there (DH + 8 halves)
const int PPU = BK / 8 + 1;       // P row pitch there (BK + 8 halves)
const int AP = SP4 > QP ? SP4 : QP;   // the team area's row pitch in uvec4
// P goes beside S where the row has room (BK 16 with DH 64: S in uvec4 0-4, P in 5-7), else over it once S is read
const int PO = SP4 + PPU <= AP ? SP4 : 0;
const int HB4 = BK / 8;           // vec4 of S (f16vec4 of P) per half row
const int NST = 32 * NR;          // invocations staging one split's K/V
const int PF = BK * DH4 / NST;    // f16vec4 of K (and as many of V) each of them carries per block
const int SPLIT_KV = 2 * BK * KP4;
const float NEG = -1.0e30;        // "no max yet": finite, so exp2(NEG - m) = 0 and NEG - NEG = 0, never NaN
const float RESCALE_LOG2 = 8.0;   // P <= 2^8 between rescales

layout(set = 0, binding = 0, std430) writeonly buffer out_buf { f16vec4 t_out[]; };
layout(set = 0, binding = 0, std430) writeonly buffer po_buf { vec4 t_po[]; };   // SPLIT: O partials
layout(set = 0, binding = 0, std430) writeonly buffer ml_buf { vec2 t_ml[]; };   // SPLIT: (m, l) per row
layout(set = 0, binding = 1, std430) readonly buffer q_buf { f16vec4 t_q[]; };
layout(set = 0, binding = 2, std430) readonly buffer k_buf { f16vec4 t_k[]; };
layout(set = 0, binding = 3, std430) readonly buffer v_buf { f16vec4 t_v[]; };

layout(push_constant) uniform Params {
  ivec4 dims;   // Tq, Tk, heads, D / 4
  vec4 scale;   // scale * log2(e)
  ivec4 split;  // S, ml_base (index of the first (m, l) pair in t_ml); S = 1 without SPLIT
} p;

shared f16vec4 skv[KS * SPLIT_KV];  // per split: K rows of its block, then V rows; at the start, Q rows per team
shared uvec4 sa[NS * 16 * AP];      // per team: Q, then S (fp32 bits) and P (packed fp16) in turn, O tiles
shared float sm[NS * 16], sl[NS * 16];  // per team row at the end: max and sum

int team, lane;

#if defined(IMPL_KHR)
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ZERO_C MAT_C(0.0)
#define MMA(A, B, C) coopMatMulAdd(A, B, C)
#define LOAD_ROW(M, ARR, OFF, STR) coopMatLoad(M, ARR, uint(OFF), uint(STR), gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COL(M, ARR, OFF, STR) coopMatLoad(M, ARR, uint(OFF), uint(STR), gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_ROW(M, ARR, OFF, STR) coopMatStore(M, ARR, uint(OFF), uint(STR), gl_CooperativeMatrixLayoutRowMajor)
// the team area (uvec4): fp32 accumulators stored and loaded as they are, fp16 A operands read from packed halves;
// offsets and strides in uvec4 (4 floats or 8 halves)
#define STORE_AREA(M, OFF, STR) coopMatStore(M, sa, uint(OFF), uint(STR), gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_AREA(M, OFF, STR) coopMatLoad(M, sa, uint(OFF), uint(STR), gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_AREA_H(M, OFF, STR) coopMatLoad(M, sa, uint(OFF), uint(STR), gl_CooperativeMatrixLayoutRowMajor)
#define TEAM_SYNC() { subgroupMemoryBarrierShared(); subgroupBarrier(); }
bool team_any(bool x) { return subgroupAny(x); }
float pair_max(float x) { return max(x, subgroupShuffleXor(x, 16u)); }
float pair_sum(float x) { return x + subgroupShuffleXor(x, 16u); }
#else
// Emulated 16 x 16 tiles: lane L holds row L % 16, columns (L / 16) * 8 .. + 7, as fp32 (fp16 values exactly).
struct Frag { float v[8]; };
#define MAT_A Frag
#define MAT_B Frag
#define MAT_C Frag
shared float emu_x[NS * 512];
shared float emu_pair[NS * 32];
shared uint emu_flag;
#define TEAM_SYNC() { memoryBarrierShared(); barrier(); }
#define EMU_BASE(OFF, STR) (int(OFF) * 4 + (lane % 16) * int(STR) * 4 + (lane / 16) * 8)
// offsets and strides in elements of ARR (f16vec4 or vec4), as coopMatLoad / coopMatStore take them
#define LOAD_ROW(M, ARR, OFF, STR) { int o_ = EMU_BASE(OFF, STR); \
    [[unroll]] for (int i_ = 0; i_ < 8; ++i_) M.v[i_] = float(ARR[(o_ + i_) >> 2][(o_ + i_) & 3]); }
#define LOAD_COL(M, ARR, OFF, STR) { int o_ = int(OFF) * 4 + (lane % 16); \
    [[unroll]] for (int i_ = 0; i_ < 8; ++i_) { int e_ = o_ + ((lane / 16) * 8 + i_) * int(STR) * 4; \
      M.v[i_] = float(ARR[e_ >> 2][e_ & 3]); } }
#define STORE_ROW(M, ARR, OFF, STR) { int o_ = EMU_BASE(OFF, STR); \
    [[unroll]] for (int i_ = 0; i_ < 8; ++i_) ARR[(o_ + i_) >> 2][(o_ + i_) & 3] = M.v[i_]; }
// the team area: floats as their bits, halves two to a uint (offsets and strides in uvec4)
#define STORE_AREA(M, OFF, STR) { int o_ = EMU_BASE(OFF, STR); \
    [[unroll]] for (int i_ = 0; i_ < 8; ++i_) sa[(o_ + i_) >> 2][(o_ + i_) & 3] = floatBitsToUint(M.v[i_]); }
#define LOAD_AREA(M, OFF, STR) { int o_ = EMU_BASE(OFF, STR); \
    [[unroll]] for (int i_ = 0; i_ < 8; ++i_) M.v[i_] = uintBitsToFloat(sa[(o_ + i_) >> 2][(o_ + i_) & 3]); }
#define LOAD_AREA_H(M, OFF, STR) { int h_ = int(OFF) * 8 + (lane % 16) * int(STR) * 8 + (lane / 16) * 8; \
    [[unroll]] for (int i_ = 0; i_ < 8; ++i_) \
      M.v[i_] = float(unpackFloat2x16(sa[(h_ + i_) >> 3][((h_ + i_) >> 1) & 3])[(h_ + i_) & 1]); }
#define ZERO_C emu_zero()
#define MMA(A, B, C) emu_mma(A, B, C)
Frag emu_zero() {
  Frag f;
  [[unroll]] for (int i = 0; i < 8; ++i) f.v[i] = 0.0;
  return f;
}
Frag emu_mma(Frag a, Frag b, Frag c) {
  int base = team * 512, r = lane % 16, c0 = (lane / 16) * 8;
  [[unroll]] for (int i = 0; i < 8; ++i) {
    emu_x[base + r * 16 + c0 + i] = a.v[i];
    emu_x[base + 256 + r * 16 + c0 + i] = b.v[i];
  }
  TEAM_SYNC()
  [[unroll]] for (int i = 0; i < 8; ++i) {
    float s = 0.0;
    for (int k = 0; k < 16; ++k) s += emu_x[base + r * 16 + k] * emu_x[base + 256 + k * 16 + c0 + i];
    c.v[i] += s;
  }
  TEAM_SYNC()
  return c;
}
bool team_any(bool x) {  // over the whole work group: every team sync is a work group barrier here
  barrier();
  if (gl_LocalInvocationIndex == 0) emu_flag = 0u;
  barrier();
  if (x) atomicOr(emu_flag, 1u);
  barrier();
  bool r = emu_flag != 0u;
  barrier();
  return r;
}
float pair_other(float x) {
  emu_pair[team * 32 + lane] = x;
  TEAM_SYNC()
  float y = emu_pair[team * 32 + (lane ^ 16)];
  TEAM_SYNC()
  return y;
}
float pair_max(float x) { return max(x, pair_other(x)); }
float pair_sum(float x) { return x + pair_other(x); }
#endif

f16vec4 pk[PF], pv[PF];  // the next block of this invocation's split, in flight

// Issue the loads of block jb (keys jb*BK ..) of K and V, zeros from key jend on (masked keys must meet no NaN).
void fetch(int jb, int sidx, int b, int hc, int Tk, int jend, int D4) {
  [[unroll]] for (int i = 0; i < PF; ++i) {
    int e = sidx + NST * i, j = jb * BK + e / DH4;
    int g = (b * Tk + j) * D4 + hc + e % DH4;
    pk[i] = j < jend ? t_k[g] : f16vec4(0.0);
    pv[i] = j < jend ? t_v[g] : f16vec4(0.0);
  }
}

void put(int kv, int sidx) {
  [[unroll]] for (int i = 0; i < PF; ++i) {
    int e = sidx + NST * i, at = kv + (e / DH4) * KP4 + e % DH4;
    skv[at] = pk[i];
    skv[at + BK * KP4] = pv[i];
  }
}

void main() {
#if defined(IMPL_KHR)
  team = int(gl_SubgroupID);
  lane = int(gl_SubgroupInvocationID);
#else
  team = int(gl_LocalInvocationIndex) / 32;
  lane = int(gl_LocalInvocationIndex) % 32;
#endif
  int Tq = p.dims.x, Tk = p.dims.y, H = p.dims.z, D4 = p.dims.w;
  float c = p.scale.x;
  int S = SPLIT ? p.split.x : 1;
  int bh = int(gl_WorkGroupID.z) / S, sk = int(gl_WorkGroupID.z) % S;
  int nb = (Tk + BK - 1) / BK;
  int bbeg = sk * nb / S, bend = (sk + 1) * nb / S;   // this group's key blocks
  int jend = min(bend * BK, Tk);                       // keys from here on are masked
  int rt = team % NR, ks = team / NR;
  int b = bh / H, hc = (bh % H) * DH4;
  int q0 = int(gl_WorkGroupID.y) * BQ + rt * 16;  // the team's first query row
  int r = lane % 16, hf = lane / 16;              // the lane's row and half in softmax and output
  int sidx = rt * 32 + lane;                      // index among the split's staging invocations
  int kv = ks * SPLIT_KV;                         // the split's K rows; its V rows follow at + BK KP4
  int sb = team * 16 * AP;                        // the team's area

  // Q: the team's 16 rows (zeros past Tq) through its area (8 halves to a uvec4) into cooperative matrices, once.
  for (int e = lane; e < 16 * (DH / 8); e += 32) {
    int t = q0 + e / (DH / 8), u = e % (DH / 8);
    int g = (b * Tq + t) * D4 + hc + 2 * u;
    f16vec4 x = t < Tq ? t_q[g] : f16vec4(0.0), y = t < Tq ? t_q[g + 1] : f16vec4(0.0);
    sa[sb + (e / (DH / 8)) * AP + u] = uvec4(packFloat2x16(x.xy), packFloat2x16(x.zw), packFloat2x16(y.xy),
                                             packFloat2x16(y.zw));
  }
  TEAM_SYNC()
  MAT_A qa[DT];
  [[unroll]] for (int d = 0; d < DT; ++d) LOAD_AREA_H(qa[d], sb + 2 * d, AP);
  TEAM_SYNC()  // Q is read before S overwrites the area

  int iters = (bend - bbeg + KS - 1) / KS;  // blocks per in-group split (the last ones may be all masked)
  if (iters > 0) {
    fetch(bbeg + ks, sidx, b, hc, Tk, jend, D4);
    put(kv, sidx);
  }
  if (iters > 1) fetch(bbeg + KS + ks, sidx, b, hc, Tk, jend, D4);

  MAT_C o[DT];
  [[unroll]] for (int d = 0; d < DT; ++d) o[d] = ZERO_C;
  float m = NEG;   // the row's running (possibly stale) max of t = s * scale * log2(e); equal in both lanes
  float l = 0.0;   // this lane's share of the row's sum of P, against m

  for (int it = 0; it < iters; ++it) {
    barrier();  // the block is staged
    int j0 = (bbeg + it * KS + ks) * BK + hf * (BK / 2);  // the lane's first key

    // S = Q K^T: K rows are the columns of K^T, so K^T is a column-major view of the staged K.
    [[unroll]] for (int n = 0; n < KT; ++n) {
      MAT_C acc = ZERO_C;
      [[unroll]] for (int d = 0; d < DT; ++d) {
        MAT_B kt;
        LOAD_COL(kt, skv, kv + n * 16 * KP4 + 4 * d, KP4);
        acc = MMA(qa[d], kt, acc);
      }
      STORE_AREA(acc, sb + 4 * n, AP);
    }
    TEAM_SYNC()

    vec4 tv[HB4];
    float bm = NEG;
    [[unroll]] for (int i = 0; i < HB4; ++i) {
      tv[i] = uintBitsToFloat(sa[sb + r * AP + hf * HB4 + i]) * c;
      [[unroll]] for (int u = 0; u < 4; ++u)
        if (j0 + 4 * i + u < jend) bm = max(bm, tv[i][u]);
    }
    bm = pair_max(bm);
    bool rescale = team_any(bm > m + RESCALE_LOG2);
    float alpha = 1.0;
    if (rescale) {
      float mn = max(m, bm);
      alpha = exp2(m - mn);
      m = mn;
      l *= alpha;
    }
    if (PO == 0) TEAM_SYNC()  // S is read: P may overwrite it

    if (rescale && it > 0) {  // O rows *= alpha, one tile at a time through the team's area (rare)
      if (PO != 0) TEAM_SYNC()  // S is read: the O tiles may overwrite it
      [[unroll]] for (int d = 0; d < DT; ++d) {
        STORE_AREA(o[d], sb, AP);
        TEAM_SYNC()
        [[unroll]] for (int q = 0; q < 2; ++q) {
          int at = sb + r * AP + 2 * hf + q;
          sa[at] = floatBitsToUint(uintBitsToFloat(sa[at]) * alpha);
        }
        TEAM_SYNC()
        LOAD_AREA(o[d], sb, AP);
        TEAM_SYNC()
      }
    }

    float sum = 0.0;
    [[unroll]] for (int i = 0; i < HB4; i += 2) {
      vec4 pe0, pe1;
      [[unroll]] for (int u = 0; u < 4; ++u) {
        pe0[u] = j0 + 4 * i + u < jend ? exp2(tv[i][u] - m) : 0.0;
        pe1[u] = j0 + 4 * i + 4 + u < jend ? exp2(tv[i + 1][u] - m) : 0.0;
      }
      f16vec4 h0 = f16vec4(pe0), h1 = f16vec4(pe1);
      sa[sb + r * AP + PO + hf * (HB4 / 2) + i / 2] = uvec4(packFloat2x16(h0.xy), packFloat2x16(h0.zw),
                                                        packFloat2x16(h1.xy), packFloat2x16(h1.zw));
      vec4 p0 = vec4(h0), p1 = vec4(h1);  // the sum takes P as P V will: rounded to fp16
      sum += ((p0.x + p0.y) + (p0.z + p0.w)) + ((p1.x + p1.y) + (p1.z + p1.w));
    }
    l += sum;
    TEAM_SYNC()  // P is written

    // O += P V (V rows are row-major B tiles).
    MAT_A pa[KT];
    [[unroll]] for (int n = 0; n < KT; ++n) LOAD_AREA_H(pa[n], sb + PO + 2 * n, AP);
    [[unroll]] for (int d = 0; d < DT; ++d)
      [[unroll]] for (int n = 0; n < KT; ++n) {
        MAT_B vb;
        LOAD_ROW(vb, skv, kv + BK * KP4 + n * 16 * KP4 + 4 * d, KP4);
        o[d] = MMA(pa[n], vb, o[d]);
      }

    barrier();  // every team is done with this block's K, V (and its own area)
    if (it + 1 < iters) {
      put(kv, sidx);
      if (it + 2 < iters) fetch(bbeg + (it + 2) * KS + ks, sidx, b, hc, Tk, jend, D4);
    }
  }

  // Merge the in-group key splits of each row; store O / l, or with SPLIT the merged O and (m, l) as partials.
  float lr = pair_sum(l);
  barrier();  // every team is done with its area
  if (hf == 0) {
    sm[team * 16 + r] = m;
    sl[team * 16 + r] = lr;
  }
  barrier();
  float w[KS];
  float mx = NEG, lt = 0.0;
  [[unroll]] for (int s = 0; s < KS; ++s) mx = max(mx, sm[(s * NR + rt) * 16 + r]);
  [[unroll]] for (int s = 0; s < KS; ++s) {
    w[s] = exp2(sm[(s * NR + rt) * 16 + r] - mx);
    lt += sl[(s * NR + rt) * 16 + r] * w[s];
  }
  float inv = SPLIT ? 1.0 : 1.0 / lt;  // lt >= 1 unsplit: the row's largest P is >= 1 in the split that holds its max
  int t = q0 + r;
  int prow = int(gl_WorkGroupID.z) * Tq + t;   // SPLIT: ((b * H + h) * S + s) * Tq + t
  if (SPLIT && ks == 0 && hf == 0 && t < Tq) t_ml[p.split.y + prow] = vec2(mx, lt);
  [[unroll]] for (int d = 0; d < DT; ++d) {
    STORE_AREA(o[d], sb, AP);
    barrier();
    if (ks == 0 && t < Tq) {
      vec4 a0 = vec4(0.0), a1 = vec4(0.0);
      [[unroll]] for (int s = 0; s < KS; ++s) {
        int at = (s * NR + rt) * 16 * AP + r * AP + 2 * hf;
        a0 += uintBitsToFloat(sa[at]) * w[s];
        a1 += uintBitsToFloat(sa[at + 1]) * w[s];
      }
      if (SPLIT) {
        t_po[prow * DH4 + 4 * d + 2 * hf] = a0;
        t_po[prow * DH4 + 4 * d + 2 * hf + 1] = a1;
      } else {
        int g = (b * Tq + t) * D4 + hc + 4 * d + 2 * hf;
        t_out[g] = to_elem4(a0 * inv);
        t_out[g + 1] = to_elem4(a1 * inv);
      }
    }
    barrier();
  }
}
