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

void main() {
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (!texel_in_range(pos, p.out_sizes, p.pd.x)) return;
  ivec4 o = texel_origin(pos, p.out_sizes, p.pd.x);
  vec4 r = vec4(0.0);
  for (int l = 0; l < 4; ++l) {
    ivec4 i = o;
    i[p.pd.x] += l;
    if (i[p.pd.x] >= p.out_sizes[p.pd.x]) break;
    float acc = 0.0;
    int n = 0;
    bool got = false;   // max: a value that is not NaN was seen
    for (int kh = 0; kh < p.kern.x; ++kh) {
      int ih = i.y * p.kern.z - p.pad.x + kh * p.pad.z;
      bool row_in = ih >= 0 && ih < p.in_sizes.y;
      bool row_counts = ih >= p.cnt.x && ih < p.cnt.z;
      for (int kw = 0; kw < p.kern.y; ++kw) {
        int iw = i.x * p.kern.w - p.pad.y + kw * p.pad.w;
        if (row_counts && iw >= p.cnt.y && iw < p.cnt.w) ++n;
        if (!row_in || iw < 0 || iw >= p.in_sizes.x) continue;
        float v = LOAD(t_in, ivec4(iw, ih, i.z, i.w), p.in_sizes, p.pd.y);
        if (OP == 1) {
          acc += v;
        } else if (!isnan(v) && (!got || v > acc)) {   // NaN is skipped, as onnxruntime and ONNX's reference do
          acc = v;
          got = true;
        }
      }
    }
    r[l] = OP == 1 ? acc / float(n) : got ? acc : NAN_F;   // a window of NaN alone gives NaN
  }
  STORE4(t_out, o, p.out_sizes, p.pd.x, r);
}
