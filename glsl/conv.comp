#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture dtype=float,half
// Direct Conv, 1-D ([N, C, L], WHCN = (L, C, N)) or 2-D ([N, C, H, W], WHCN = (W, H, C, N)).
// One invocation computes 4 output channels x 4 consecutive output columns: each weight vec4
// (4 output channels, prepacked [O/4][I/g][kh][kw]) feeds 4 columns, each input value 4 channels.
// It then writes 4 texels: one per column when the output is channels-packed, else one per channel.
#include "common.glslh"

layout(constant_id = 3) const int CONV1D = 0;

TENSOR_OUT(t_out, 0)
TENSOR_IN(t_in, 1)
WEIGHTS(w, 2)
WEIGHTS(bias, 3)

layout(push_constant) uniform Params {
  ivec4 out_sizes;  // WHCN
  ivec4 in_sizes;
  ivec4 kern;       // kh, kw, input channels per group, output channels per group
  ivec4 sd;         // stride y, x, dilation y, x
  ivec4 pad;        // pad top, left, packed dim of in, out
} p;

// WHCN index of logical element (n, c, y, x), and logical sizes (N, C, H, W) from WHCN sizes.
ivec4 at(int n, int c, int y, int x) { return CONV1D == 1 ? ivec4(x, c, n, 0) : ivec4(x, y, c, n); }
ivec4 nchw(ivec4 s) { return CONV1D == 1 ? ivec4(s.z, s.y, 1, s.x) : s.wzyx; }

float load_in(int n, int c, int y, int x) { return LOAD(t_in, at(n, c, y, x), p.in_sizes, p.pad.z); }

void main() {
  ivec4 os = nchw(p.out_sizes), is = nchw(p.in_sizes);
  int nb = (os.y + 3) >> 2;
  ivec3 pos = ivec3(gl_GlobalInvocationID);
  if (pos.x >= (os.w + 3) >> 2 || pos.y >= os.z || pos.z >= nb * os.x) return;
  int ob = pos.z % nb, n = pos.z / nb, oy = pos.y, x0 = pos.x * 4;
  int nx = min(4, os.w - x0);
  int kh = p.kern.x, kw = p.kern.y, icg = p.kern.z;

  // First input channel of each lane's group. Lanes past O take the last channel's group (their
  // weights are 0). When all 4 lanes share a group, one load serves them all.
  ivec4 oc = min(ivec4(0, 1, 2, 3) + ob * 4, os.y - 1);
  ivec4 cb = (oc / p.kern.w) * icg;
  bool one_group = cb.x == cb.w;

  vec4 b = W4(bias, ob);
  vec4 acc[4];
  for (int j = 0; j < 4; ++j) acc[j] = j < nx ? b : vec4(0.0);  // columns past W stay 0

  for (int ic = 0; ic < icg; ++ic) {
    for (int ky = 0; ky < kh; ++ky) {
      int iy = oy * p.sd.x - p.pad.x + ky * p.sd.z;
      if (iy < 0 || iy >= is.z) continue;
      for (int kx = 0; kx < kw; ++kx) {
        vec4 wv = W4(w, ((ob * icg + ic) * kh + ky) * kw + kx);
        for (int j = 0; j < nx; ++j) {
          int ix = (x0 + j) * p.sd.y - p.pad.y + kx * p.sd.w;
          if (ix < 0 || ix >= is.w) continue;
          vec4 v = one_group ? vec4(load_in(n, cb.x + ic, iy, ix))
                             : vec4(load_in(n, cb.x + ic, iy, ix), load_in(n, cb.y + ic, iy, ix),
                                    load_in(n, cb.z + ic, iy, ix), load_in(n, cb.w + ic, iy, ix));
          acc[j] += v * wv;
        }
      }
    }
  }

  if (p.pad.w == 2) {
    for (int j = 0; j < nx; ++j) STORE4(t_out, at(n, ob * 4, oy, x0 + j), p.out_sizes, 2, acc[j]);
  } else {
    for (int l = 0; l < 4 && ob * 4 + l < os.y; ++l)
      STORE4(t_out, at(n, ob * 4 + l, oy, x0), p.out_sizes, 0, vec4(acc[0][l], acc[1][l], acc[2][l], acc[3][l]));
  }
}
