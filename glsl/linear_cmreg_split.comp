#version 450
// variants: tile=r64n64,r32n64 w=float,i8,q4 dtype=half,f16x3
// exclude: w=i8 dtype=f16x3
// exclude: w=q4 dtype=f16x3
// linear_cmreg.comp with K split across work groups (SPLIT_K): fp32 partials for linear_reduce.comp.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#if defined(DTYPE_F16X3)   // fp32 from split operands (SPLIT3): quad maxima of the rows' scales
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#define REGFED 1
#define SPLIT_K 1
#include "linear_cm.glslh"
