#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#if defined(MAX_SHUFFLE)
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// variants: storage=buffer,texture max=smem,shuffle dtype=float,half
// exclude: storage=texture max=shuffle
// Attention with the keys split S ways across work groups (flash decoding), for grids too small to fill
// a big GPU: each group writes its unnormalised partial output and row max / sum to an fp32 scratch
// buffer (binding 0) instead of out; attention_combine.comp merges the S partials. Body: attention.glslh.
#define ATTENTION_SPLIT 1
#include "common.glslh"
#include "attention.glslh"
