#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
// variants: impl=khr,emu dtype=half,f16x3
// Multi-head attention on cooperative matrices with the softmax in registers: attention_cm.comp's semantics, bindings
// and push constants (and its SPLIT partials for attention_combine.comp), for devices whose 16 x 16 matrices keep
// their elements where cm_layout.glslh says (DeviceProfile.coopmat_layout "mma", probed at start-up).
//
// There an accumulator element and an A-operand element with the same index sit at the same (row, column), and each
// row lies in the 4 lanes L/4 of one quad. So, flash-attention style, a team (one subgroup, 16 query rows) keeps
// everything of its rows in registers: S = Q K^T for a block of BK keys as BK / 16 accumulators; the block's row
// maxima from its own elements and two xor shuffles; O and the row sums l rescaled by exp2(m_old - m_new) element by
// element; P = exp2(S - m) written straight into A operands (fp16); O += P V. No S or P goes through shared memory and
// no team waits on another except to stage K and V: NR teams share each block of K and V rows in shared memory (the
// next block in flight in registers), two work group barriers a block.
//
// The row sum takes P as P V does, rounded to fp16; t = s * scale * log2(e) in fp32 and O in fp32 throughout; the
// output is stored saturating (every _half kernel). SPLIT: work group z = (b * H + h) * S + s takes key blocks
// [s nb / S, (s + 1) nb / S) and writes O unnormalised (fp32) with (m, l) per row, attention.glslh's layout.
//
// impl=emu: the matrix operations as plain code on the same layout (lanes are invocations, each team's tiles go
// through shared memory, the shuffles too; a team sync is a work group barrier). Tests run it where there are no
// cooperative matrices (lavapipe): everything but the matrix instructions and the device's layout itself.
//
// SPLIT3 (dtype=f16x3; Session option fp32_precision="f16x3"): fp32 attention from split operands. q, k, v, the mask
// and out are float32; each operand x is taken as (hi + lo 2^-11) 2^-s, hi and lo fp16 (split3.glslh), and of the four
// products hi hi + (hi lo + lo hi) 2^-11 are kept (lo lo: at most 2^-22 of the product, mostly far less), each sum in
// its own fresh accumulators, combined in fp32 outside the matrix unit. The powers of two s, chosen where the values
// are staged:
//   Q per query row and K per key (the largest |x| of the row's DH values, over the DH / 4 lanes that stage it, into
//     [2^14, 2^15)): S = Q K^T is then scaled back element by element, 2^-(s_row + s_key), exact;
//   V per key likewise; since a key's scale cannot be taken out of the sum over keys, it goes into P instead: P's
//     element (row, key) is P 2^(15 + r - s_key), r the smallest s_key of the row's keys in the block, so every
//     element is at most 2^15 (P <= 1; P's own fixed scale 2^15 keeps lo clear of fp16's subnormals down to
//     P ~ 2^-28, far below what a row sum of at least 1 can feel), and the block's P V comes out times 2^(15 + r),
//     taken off before it joins O. The block's P V runs in fresh accumulators, so the matrix unit's own fp32
//     accumulation covers one block (BK keys) only, as linear_cm.glslh's slices.
// A value below 2^-28 of its row's largest (Q, K, V rows) keeps fewer bits in lo: it weighs less than fp32's rounding
// of that row's largest term. The softmax is the fp32 kernel's (attention.glslh): t = s scale log2(e) (+ the mask in
// the log2 domain, floored at NEG = the lowest float, -inf kept), exp2, fp32 row sums of P (not of its split).
#if defined(DTYPE_F16X3)
#define SPLIT3 1
#endif
#if defined(IMPL_KHR)
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glslh"
#include "cm_layout.glslh"

layout(constant_id = 3) const int DH = 64;   // head dim, a multiple of 16
layout(constant_id = 4) const int NR = 4;    // teams (subgroups of 32): 16 NR query rows per work group
layout(constant_id = 5) const int BK = 32;   // keys per block, a multiple of 16
layout(constant_id = 6) const bool SPLIT = false;
// VEC8: K and V are fetched 8 halves (16 bytes) a load, half the loads of a block, where k and v start 16-byte
// aligned (minirt/kernels/attention_cmr.py checks; DH is a multiple of 16, so every row slice is whole 8-half groups).
layout(constant_id = 7) const bool VEC8 = false;
// MASK: an additive mask (binding 4, float16 [B', H', Tq', Tk'], each dim 1 or full: p.mshape) is added to t before
// the row maxima, in the log2 domain as attention.glslh does, with this kernel's NEG as the floor: a mask at fp16's
// lowest (float32's min, saturated) makes t = NEG, a row of nothing else uniform as in onnxruntime; -inf stays -inf,
// a row of nothing else has l = 0 and gives NaN, or 0 where p.mflags.x says (the exporters' ReplaceNaN(0)).
layout(constant_id = 8) const bool MASK = false;

const int DH4 = DH / 4;
const int DT = DH / 16;           // 16-column tiles of the head
const int KT = BK / 16;           // 16-key tiles of a block
const int KP4 = DH4 + 2;          // K/V (and Q) row pitch in f16vec4: DH + 8 halves, no bank conflicts
const int NST = 32 * NR;
const int PF = BK * DH4 / NST;    // f16vec4 of K (and as many of V) each invocation carries per block
const int DH8 = DH / 8;
const int PF8 = (BK * DH8 + NST - 1) / NST;   // VEC8: uvec4 (8 halves) of K (and of V) per invocation per block
#if defined(SPLIT3)
// each operand in two planes of fp16 rows, hi then lo: K hi, K lo, V hi, V lo; at the start Q hi, Q lo
const int ROWS = 4 * BK > 32 * NR ? 4 * BK : 32 * NR;
const int V0 = 2 * BK * KP4;      // where V's rows start in skv
const int LO = BK * KP4;          // K's (V's) lo plane after its hi plane
const int QLO = 16 * NR * KP4;    // Q's lo plane
// "no max yet", and the mask's floor: the lowest float, as attention.glslh (finite: exp2(NEG - m) = 0, NEG - NEG = 0)
const float NEG = -3.402823466e38;
#define MASK_LOWEST NEG
#else
const int ROWS = 2 * BK > 16 * NR ? 2 * BK : 16 * NR;   // K then V rows of a block; at the start, the group's Q rows
const float NEG = -1.0e30;        // "no max yet": finite, so exp2(NEG - m) = 0 and NEG - NEG = 0, never NaN
#define MASK_LOWEST -65504.0      // fp16's lowest (float32's min, saturated) floors t at NEG
#endif
#if defined(SPLIT3)
#define IO4 vec4
#define OUT2 vec2
#define MASK_T float
#else
#define IO4 f16vec4
#define OUT2 f16vec2
#define MASK_T float16_t
#endif

layout(set = 0, binding = 0, std430) writeonly buffer out_buf { OUT2 t_out2[]; };
layout(set = 0, binding = 0, std430) writeonly buffer po_buf { vec2 t_po2[]; };  // SPLIT: O partials
layout(set = 0, binding = 0, std430) writeonly buffer ml_buf { vec2 t_ml[]; };   // SPLIT: (m, l) per row
layout(set = 0, binding = 1, std430) readonly buffer q_buf { IO4 t_q[]; };
layout(set = 0, binding = 2, std430) readonly buffer k_buf { IO4 t_k[]; };
layout(set = 0, binding = 3, std430) readonly buffer v_buf { IO4 t_v[]; };
layout(set = 0, binding = 2, std430) readonly buffer k8_buf { uvec4 t_k8[]; };
layout(set = 0, binding = 3, std430) readonly buffer v8_buf { uvec4 t_v8[]; };
layout(set = 0, binding = 4, std430) readonly buffer mask_buf { MASK_T t_mask[]; };   // MASK (else q, unread)

layout(push_constant) uniform Params {
  ivec4 dims;   // Tq, Tk, heads, D / 4
  vec4 scale;   // scale * log2(e)
  ivec4 split;  // S, ml_base (index of the first (m, l) pair in t_ml); S = 1 without SPLIT
  ivec4 mshape; // MASK: the mask's B', H', Tq', Tk'
  ivec4 mflags; // MASK: 1: a row of only -inf gives 0, not NaN
} p;

// The mask at (batch b, head h, query row t, key j) in the log2 domain (MASK above).
float mask_log2(int b, int h, int t, int j) {
  ivec4 ms = p.mshape;
  float x = float(t_mask[(((ms.x > 1 ? b : 0) * ms.y + (ms.y > 1 ? h : 0)) * ms.z + (ms.z > 1 ? t : 0)) * ms.w +
                         (ms.w > 1 ? j : 0)]);
  return isinf(x) && x < 0.0 ? x : x <= MASK_LOWEST ? NEG : max(x * 1.4426950408889634, NEG);
}

shared f16vec4 skv[ROWS * KP4];
#if defined(SPLIT3)
#include "split3.glslh"
shared int sx_q[16 * NR];    // the scale exponent of each Q row of the group
shared int sx_k[BK];         // ... of each K row (key) of the staged block
shared int sx_v[BK];         // ... of each V row
#endif

int team, lane;

#if defined(IMPL_KHR)
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define ZERO_A MAT_A(0.0)
#define ZERO_C MAT_C(0.0)
#define MMA(A, B, C) coopMatMulAdd(A, B, C)
#define EL(M, e) M[e]
#define LOAD_ROW(M, OFF) coopMatLoad(M, skv, uint(OFF), uint(KP4), gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COL(M, OFF) coopMatLoad(M, skv, uint(OFF), uint(KP4), gl_CooperativeMatrixLayoutColumnMajor)
float quad_max(float x) {
  x = max(x, subgroupShuffleXor(x, 1u));
  return max(x, subgroupShuffleXor(x, 2u));
}
float quad_sum(float x) {
  x += subgroupShuffleXor(x, 1u);
  return x + subgroupShuffleXor(x, 2u);
}
#if defined(SPLIT3)
float lane_xor(float x, int o) { return subgroupShuffleXor(x, uint(o)); }
#endif
#else
// Emulated 16 x 16 tiles in cm_layout.glslh's layout: lane L holds element e at cm_elem(L, e), as fp32 (fp16 values
// exactly for A and B). B tiles use it too (row = k, column = n); only the emulated MMA reads them.
struct Frag { float v[8]; };
#define MAT_A Frag
#define MAT_B Frag
#define MAT_C Frag
#define ZERO_A emu_zero()
#define ZERO_C emu_zero()
#define MMA(A, B, C) emu_mma(A, B, C)
#define EL(M, e) M.v[e]
shared float emu_x[NR * 512];
shared float emu_q[NR * 32];
float elem_at(int off, int r, int c) { return float(skv[off + r * KP4 + (c >> 2)][c & 3]); }
// row-major: element (r, c) at row r, column c of the staged rows; column-major (K^T): at row c, column r
#define LOAD_ROW(M, OFF) { [[unroll]] for (int e_ = 0; e_ < 8; ++e_) { ivec2 rc_ = cm_elem(lane, e_); \
    M.v[e_] = elem_at(int(OFF), rc_.x, rc_.y); } }
#define LOAD_COL(M, OFF) { [[unroll]] for (int e_ = 0; e_ < 8; ++e_) { ivec2 rc_ = cm_elem(lane, e_); \
    M.v[e_] = elem_at(int(OFF), rc_.y, rc_.x); } }
Frag emu_zero() {
  Frag f;
  [[unroll]] for (int i = 0; i < 8; ++i) f.v[i] = 0.0;
  return f;
}
Frag emu_mma(Frag a, Frag b, Frag c) {
  int base = team * 512;
  [[unroll]] for (int e = 0; e < 8; ++e) {
    ivec2 rc = cm_elem(lane, e);
    emu_x[base + rc.x * 16 + rc.y] = a.v[e];
    emu_x[base + 256 + rc.x * 16 + rc.y] = b.v[e];
  }
  barrier();
  [[unroll]] for (int e = 0; e < 8; ++e) {
    ivec2 rc = cm_elem(lane, e);
    float s = 0.0;
    for (int k = 0; k < 16; ++k) s += emu_x[base + rc.x * 16 + k] * emu_x[base + 256 + k * 16 + rc.y];
    c.v[e] += s;
  }
  barrier();
  return c;
}
float quad_other(float x, int o) {
  emu_q[team * 32 + lane] = x;
  barrier();
  float y = emu_q[team * 32 + (lane ^ o)];
  barrier();
  return y;
}
float quad_max(float x) {
  x = max(x, quad_other(x, 1));
  return max(x, quad_other(x, 2));
}
float quad_sum(float x) {
  x += quad_other(x, 1);
  return x + quad_other(x, 2);
}
#if defined(SPLIT3)
float lane_xor(float x, int o) { return quad_other(x, o); }
#endif
#endif
#if defined(SPLIT3)
// The largest |x| of a row staged by DH / 4 consecutive lanes (one vec4 each; a row's lanes lie in one subgroup, since
// DH / 4 divides 32 and the staging index is team * 32 + lane), on every one of them; called in uniform control flow.
float row_absmax(vec4 x) {
  vec4 a = abs(x);
  float m = max(max(a.x, a.y), max(a.z, a.w));
  [[unroll]] for (int o = 1; o < DH4; o <<= 1) m = max(m, lane_xor(m, o));
  return m;
}
// the split of a row's vec4 by its row's exponent s, into planes at skv[at] (hi) and skv[at + lo_off] (lo)
void put_split(vec4 x, int s, int at, int lo_off) {
  vec4 xs = x * pow2(s);
  vec4 h = hi11(xs);
  skv[at] = f16vec4(h);
  skv[at + lo_off] = f16vec4((xs - h) * 2048.0);
}
#endif

IO4 pk[PF], pv[PF];  // the next block of K and V rows, in flight
uvec4 pk8[PF8], pv8[PF8];  // the same with VEC8

// Issue the loads of block jb (keys jb * BK ..), zeros from key jend on (masked keys must meet no NaN).
void fetch(int jb, int sidx, int b, int hc, int Tk, int jend, int D4) {
  if (VEC8) {
    [[unroll]] for (int i = 0; i < PF8; ++i) {
      int e = sidx + NST * i, j = jb * BK + e / DH8;
      int g = (((b * Tk + j) * D4 + hc) >> 1) + e % DH8;     // D4 and hc are even
      bool ok = e < BK * DH8 && j < jend;
      pk8[i] = ok ? t_k8[g] : uvec4(0);
      pv8[i] = ok ? t_v8[g] : uvec4(0);
    }
    return;
  }
  [[unroll]] for (int i = 0; i < PF; ++i) {
    int e = sidx + NST * i, j = jb * BK + e / DH4;
    int g = (b * Tk + j) * D4 + hc + e % DH4;
    pk[i] = j < jend ? t_k[g] : IO4(0.0);
    pv[i] = j < jend ? t_v[g] : IO4(0.0);
  }
}

f16vec4 h4(uvec2 u) { return f16vec4(unpackFloat2x16(u.x), unpackFloat2x16(u.y)); }

void put(int sidx) {
  if (VEC8) {
    [[unroll]] for (int i = 0; i < PF8; ++i) {
      int e = sidx + NST * i, at = (e / DH8) * KP4 + 2 * (e % DH8);
      if (e < BK * DH8) {
        skv[at] = h4(pk8[i].xy);
        skv[at + 1] = h4(pk8[i].zw);
        skv[at + BK * KP4] = h4(pv8[i].xy);
        skv[at + BK * KP4 + 1] = h4(pv8[i].zw);
      }
    }
    return;
  }
  [[unroll]] for (int i = 0; i < PF; ++i) {
    int e = sidx + NST * i, at = (e / DH4) * KP4 + e % DH4;
#if defined(SPLIT3)
    int sk = split_exp(row_absmax(pk[i])), sv = split_exp(row_absmax(pv[i]));
    put_split(pk[i], sk, at, LO);
    put_split(pv[i], sv, V0 + at, LO);
    if (e % DH4 == 0) {
      sx_k[e / DH4] = sk;
      sx_v[e / DH4] = sv;
    }
#else
    skv[at] = pk[i];
    skv[at + BK * KP4] = pv[i];
#endif
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
  int b = bh / H, hc = (bh % H) * DH4;
  int qg = int(gl_WorkGroupID.y) * 16 * NR;            // the group's first query row
#if defined(SPLIT3)
  int sidx = team * 32 + lane;   // a staged row's lanes in one subgroup (row_absmax)
#else
  int sidx = int(gl_LocalInvocationIndex);
#endif
  ivec2 rc0 = cm_elem(lane, 0);                        // this lane's rows: rc0.x and rc0.x + 8

  // Q: the group's rows (zeros past Tq) through shared memory into A operands, once per team.
  for (int e = sidx; e < 16 * NR * DH4; e += NST) {   // (DH4 / 2 rounds for every invocation)
    int t = qg + e / DH4;
#if defined(SPLIT3)
    vec4 x = t < Tq ? t_q[(b * Tq + t) * D4 + hc + e % DH4] : vec4(0.0);
    int s = split_exp(row_absmax(x));
    put_split(x, s, (e / DH4) * KP4 + e % DH4, QLO);
    if (e % DH4 == 0) sx_q[e / DH4] = s;
#else
    skv[(e / DH4) * KP4 + e % DH4] = t < Tq ? t_q[(b * Tq + t) * D4 + hc + e % DH4] : f16vec4(0.0);
#endif
  }
  barrier();
  MAT_A qa[DT];
  [[unroll]] for (int d = 0; d < DT; ++d) LOAD_ROW(qa[d], team * 16 * KP4 + 4 * d);
#if defined(SPLIT3)
  MAT_A ql[DT];
  [[unroll]] for (int d = 0; d < DT; ++d) LOAD_ROW(ql[d], QLO + team * 16 * KP4 + 4 * d);
  ivec2 xq = ivec2(sx_q[team * 16 + rc0.x], sx_q[team * 16 + rc0.x + 8]);   // the lane's two rows' exponents
#endif
  barrier();  // Q is read before K and V overwrite it

  int iters = bend - bbeg;
  if (iters > 0) {
    fetch(bbeg, sidx, b, hc, Tk, jend, D4);
    put(sidx);
  }
  if (iters > 1) fetch(bbeg + 1, sidx, b, hc, Tk, jend, D4);

  MAT_C o[DT];
  [[unroll]] for (int d = 0; d < DT; ++d) o[d] = ZERO_C;
  vec2 m = vec2(NEG);   // running max of t = s * scale * log2(e) of the lane's two rows (equal across the quad)
  vec2 l = vec2(0.0);   // this lane's share of the two rows' sums of P, against m

  for (int it = 0; it < iters; ++it) {
    barrier();  // the block is staged
    int j0 = (bbeg + it) * BK;

    // S = Q K^T: K rows are the columns of K^T, a column-major view of the staged K.
    MAT_C s[KT];
#if defined(SPLIT3)
    // hi hi in s, hi lo + lo hi in sc, then s = (s + sc 2^-11) 2^-(s_row + s_key) in two exact steps (each exponent
    // in [-126, 126]: the sum may leave a float's normal range, its halves do not)
    MAT_C sc[KT];
    [[unroll]] for (int n = 0; n < KT; ++n) {
      s[n] = ZERO_C;
      sc[n] = ZERO_C;
      [[unroll]] for (int d = 0; d < DT; ++d) {
        MAT_B kh;
        MAT_B kl;
        LOAD_COL(kh, n * 16 * KP4 + 4 * d);
        LOAD_COL(kl, LO + n * 16 * KP4 + 4 * d);
        s[n] = MMA(qa[d], kh, s[n]);
        sc[n] = MMA(qa[d], kl, sc[n]);
        sc[n] = MMA(ql[d], kh, sc[n]);
      }
      [[unroll]] for (int e = 0; e < 8; ++e) {
        int x = -((e < 4 ? xq.x : xq.y) + sx_k[n * 16 + cm_elem(lane, e).y]), h = x / 2;
        EL(s[n], e) = (EL(s[n], e) + EL(sc[n], e) * (1.0 / 2048.0)) * pow2(h) * pow2(x - h);
      }
    }
#else
    [[unroll]] for (int n = 0; n < KT; ++n) {
      s[n] = ZERO_C;
      [[unroll]] for (int d = 0; d < DT; ++d) {
        MAT_B kt;
        LOAD_COL(kt, n * 16 * KP4 + 4 * d);
        s[n] = MMA(qa[d], kt, s[n]);
      }
    }
#endif

    // with MASK, t = s c + mask (else t = s c is formed below)
    float cs = c;
    if (MASK) {
      cs = 1.0;
      [[unroll]] for (int n = 0; n < KT; ++n)
        [[unroll]] for (int e = 0; e < 8; ++e) {
          ivec2 rc = cm_elem(lane, e);
          int key = j0 + n * 16 + rc.y;
          float mk = key < jend ? mask_log2(b, bh % H, min(qg + team * 16 + rc.x, Tq - 1), key) : 0.0;
          EL(s[n], e) = float(EL(s[n], e)) * c + mk;
        }
    }

    // the block's row maxima over unmasked keys, then the new running max and the rescale factors
    vec2 bm = vec2(NEG);
    [[unroll]] for (int n = 0; n < KT; ++n)
      [[unroll]] for (int e = 0; e < 8; ++e) {
        int key = j0 + n * 16 + cm_elem(lane, e).y;
        if (key < jend) {
          if (e < 4) bm.x = max(bm.x, float(EL(s[n], e)) * cs);
          else bm.y = max(bm.y, float(EL(s[n], e)) * cs);
        }
      }
    bm = vec2(quad_max(bm.x), quad_max(bm.y));
    vec2 mn = max(m, bm);
    vec2 alpha = exp2(m - mn);
    m = mn;
    l *= alpha;
    [[unroll]] for (int d = 0; d < DT; ++d)
      [[unroll]] for (int e = 0; e < 8; ++e) EL(o[d], e) *= e < 4 ? alpha.x : alpha.y;

#if defined(SPLIT3)
    // P = exp2(t - m) in fp32, summed into l; r: the smallest V exponent of the rows' keys in the block (over the
    // quad, which holds the whole row); P's operands P 2^(15 + r - s_key) split into hi and lo A operands
    vec2 r = vec2(126.0);
    [[unroll]] for (int n = 0; n < KT; ++n)
      [[unroll]] for (int e = 0; e < 8; ++e) {
        int kb = n * 16 + cm_elem(lane, e).y;
        if (j0 + kb < jend) {
          if (e < 4) r.x = min(r.x, float(sx_v[kb]));
          else r.y = min(r.y, float(sx_v[kb]));
        }
      }
    r = -vec2(quad_max(-r.x), quad_max(-r.y));
    ivec2 ri = ivec2(r);
    MAT_A pa[KT];   // (one declarator a declaration: glslang 13 drops the use from a second coopmat one)
    MAT_A pl[KT];
    [[unroll]] for (int n = 0; n < KT; ++n) {
      pa[n] = ZERO_A;
      pl[n] = ZERO_A;
      [[unroll]] for (int e = 0; e < 8; ++e) {
        int kb = n * 16 + cm_elem(lane, e).y;
        float pf = j0 + kb < jend ? exp2(float(EL(s[n], e)) * cs - (e < 4 ? m.x : m.y)) : 0.0;
        if (e < 4) l.x += pf;
        else l.y += pf;
        float ps = pf * pow2(max(15 + (e < 4 ? ri.x : ri.y) - sx_v[kb], -126));
        float ph = hi11(vec2(ps, 0.0)).x;
        EL(pa[n], e) = float16_t(ph);
        EL(pl[n], e) = float16_t((ps - ph) * 2048.0);
      }
    }

    // O += (P V) 2^-(15 + r): the block's hi hi and its corrections in fresh accumulators (V rows are row-major B
    // tiles), added in fp32
    [[unroll]] for (int d = 0; d < DT; ++d) {
      MAT_C oh = ZERO_C;
      MAT_C oc = ZERO_C;
      [[unroll]] for (int n = 0; n < KT; ++n) {
        MAT_B vh;
        MAT_B vl;
        LOAD_ROW(vh, V0 + n * 16 * KP4 + 4 * d);
        LOAD_ROW(vl, V0 + LO + n * 16 * KP4 + 4 * d);
        oh = MMA(pa[n], vh, oh);
        oc = MMA(pa[n], vl, oc);
        oc = MMA(pl[n], vh, oc);
      }
      [[unroll]] for (int e = 0; e < 8; ++e)
        EL(o[d], e) += (EL(oh, e) + EL(oc, e) * (1.0 / 2048.0)) * pow2(-15) * pow2(-(e < 4 ? ri.x : ri.y));
    }
#else
    // P = exp2(t - m) into A operands (the same element layout), and the row sums of P as fp16 rounds it
    MAT_A pa[KT];
    [[unroll]] for (int n = 0; n < KT; ++n) {
      pa[n] = ZERO_A;
      [[unroll]] for (int e = 0; e < 8; ++e) {
        int key = j0 + n * 16 + cm_elem(lane, e).y;
        float16_t ph = float16_t(key < jend ? exp2(float(EL(s[n], e)) * cs - (e < 4 ? m.x : m.y)) : 0.0);
        EL(pa[n], e) = ph;
        if (e < 4) l.x += float(ph);
        else l.y += float(ph);
      }
    }

    // O += P V (V rows are row-major B tiles)
    [[unroll]] for (int d = 0; d < DT; ++d)
      [[unroll]] for (int n = 0; n < KT; ++n) {
        MAT_B vb;
        LOAD_ROW(vb, BK * KP4 + n * 16 * KP4 + 4 * d);
        o[d] = MMA(pa[n], vb, o[d]);
      }
#endif

    barrier();  // every team is done with this block's K and V
    if (it + 1 < iters) {
      put(sidx);
      if (it + 2 < iters) fetch(bbeg + it + 2, sidx, b, hc, Tk, jend, D4);
    }
  }

  // The rows' sums over the quad; store O / l (fp16 pairs), or with SPLIT O and (m, l) as fp32 partials.
  vec2 lt = vec2(quad_sum(l.x), quad_sum(l.y));
  vec2 inv = SPLIT ? vec2(1.0) : 1.0 / max(lt, vec2(1e-30));   // lt >= 1 wherever a key was seen
  if (MASK && !SPLIT && p.mflags.x == 0) {   // a row of only -inf scores: NaN, as onnxruntime's Softmax gives
    if (lt.x == 0.0) inv.x = NAN_F;
    if (lt.y == 0.0) inv.y = NAN_F;
  }
  int t0 = qg + team * 16 + rc0.x;                               // rows t0 and t0 + 8
  if (SPLIT && (lane & 3) == 0) {
    int prow = int(gl_WorkGroupID.z) * Tq;                       // ((b * H + h) * S + s) * Tq
    if (t0 < Tq) t_ml[p.split.y + prow + t0] = vec2(m.x, lt.x);
    if (t0 + 8 < Tq) t_ml[p.split.y + prow + t0 + 8] = vec2(m.y, lt.y);
  }
  [[unroll]] for (int d = 0; d < DT; ++d)
    [[unroll]] for (int e = 0; e < 8; e += 2) {
      ivec2 rc = cm_elem(lane, e);
      int t = qg + team * 16 + rc.x, col = d * 16 + rc.y;
      if (t >= Tq) continue;
      vec2 v = vec2(EL(o[d], e), EL(o[d], e + 1)) * (e < 4 ? inv.x : inv.y);
      if (SPLIT) {
        t_po2[((int(gl_WorkGroupID.z) * Tq + t) * DH + col) >> 1] = v;
      } else {
        t_out2[((b * Tq + t) * D4 * 4 + hc * 4 + col) >> 1] = OUT2(to_elem(v.x), to_elem(v.y));
      }
    }
}
