#version 450
// variants: tile=m64n64k32s1,m64n128k32s1 w=float,i8 dtype=half
// The tensor-core GEMM with K split across work groups (SPLIT_K in linear_cm.glslh), the one-stage tiles.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#define SPLIT_K 1
#include "linear_cm.glslh"
