#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// MaxPool / AveragePool over W and H (a 1-D pool is one of height 1, stride 1, no padding, over W alone): each
// invocation writes one output texel, 4 neighbours along the output's packed dim, each lane looping over its window.
#include "common.glslh"

layout(constant_id = 3) const int OP = 0;  // 0 max, 1 average

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)

layout(push_constant) uniform Params {
  ivec4 out_sizes;
  ivec4 in_sizes;
  ivec4 kern;   // KH, KW, stride h, stride w
  ivec4 pad;    // pad top, pad left, dilation h, dilation w
  ivec4 cnt;    // average: the rows [cnt.x, cnt.z) and columns [cnt.y, cnt.w) a window's divisor counts
  ivec4 pd;     // packed dims of out, in
} p;

// The window positions k in [0, K) whose element base + k * dil lies in [lo, hi): [first, end) (empty: first >= end).
// Only positive numbers are divided, so the rounding of negative integer division never matters.
ivec2 window_span(int base, int dil, int K, int lo, int hi) {
  int first = lo > base ? (lo - base + dil - 1) / dil : 0;
  int end = hi > base ? min(K, (hi - base + dil - 1) / dil) : 0;
  return ivec2(first, end);
}

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.out_sizes, p.pd.x)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, p.pd.x);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] >= p.out_sizes[p.pd.x]) break;
    int bh = i.y * p.kern.z - p.pad.x, bw = i.x * p.kern.w - p.pad.y;
    // The loops visit only the window positions inside the input, so a window far larger than the input (a global
    // pool written as kernel_shape = 1280 over a 2 x 2 map) costs what the input holds, not K x K iterations.
    ivec2 rows = window_span(bh, p.pad.z, p.kern.x, 0, p.in_sizes.y);
    ivec2 cols = window_span(bw, p.pad.w, p.kern.y, 0, p.in_sizes.x);
    // average: the divisor counts the window positions inside the counted region (see cnt)
    ivec2 crows = window_span(bh, p.pad.z, p.kern.x, p.cnt.x, p.cnt.z);
    ivec2 ccols = window_span(bw, p.pad.w, p.kern.y, p.cnt.y, p.cnt.w);
    int n = max(crows.y - crows.x, 0) * max(ccols.y - ccols.x, 0);
    float acc = 0.0;
    bool got = false;   // max: a value that is not NaN was seen
    for (int kh = rows.x; kh < rows.y; ++kh) {
      int ih = bh + kh * p.pad.z;
      for (int kw = cols.x; kw < cols.y; ++kw) {
        float v = LOAD(t_in, ivec4(bw + kw * p.pad.w, ih, i.z, i.w), p.in_sizes, p.pd.y);
        if (OP == 1) {
          acc += v;
        } else if (!isnan(v) && (!got || v > acc)) {   // NaN is skipped, as onnxruntime and ONNX's reference do
          acc = v;
          got = true;
        }
      }
    }
    // A window that holds no input element (dilated windows can fall between the rows or columns, or in the
    // padding) gives what onnxruntime gives: 0 for average, the lowest float for max. A max window of NaN alone
    // gives NaN.
    bool empty = rows.x >= rows.y || cols.x >= cols.y;
    if (OP == 1) {
      r[l] = empty || n == 0 ? 0.0 : acc / float(n);
    } else {
      r[l] = got ? acc : empty ? -3.402823466e38 : NAN_F;
    }
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
