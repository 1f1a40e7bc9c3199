#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#if defined(MAX_SHUFFLE)
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// variants: storage=buffer,texture max=smem,shuffle dtype=float,half
// exclude: storage=texture max=shuffle
// Multi-head attention, flash style, in one dispatch: every work group sees all the keys and writes
// normalised rows of out. The kernel and its tiling are described in attention.glslh; the key-split
// (flash decoding) pass with the same body is attention_split.comp, merged by attention_combine.comp.
#include "common.glslh"
#include "attention.glslh"
