#version 450
// variants: tile=m64n64k32s1,m64n128k32s1 w=float,i8 dtype=half
// linear_cm_split.comp with the matrix operations emulated (as linear_cm_emu.comp): for tests on lavapipe.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#define CM_EMULATE 1
#define SPLIT_K 1
#include "linear_cm.glslh"
