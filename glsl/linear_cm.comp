#version 450
// variants: tile=m64n64k64,m32n64k64,m64n128k32,m32n32k64,m16n64k64,m32n64k32,m64n64k32,m128n64k32,m128n128k32,m64n64k32w8,m64n128k32w8,m128n64k32w8,m32n128k32w8,m64n64k16,m32n64k16,m64n128k16,m64n64k32s1,m64n128k32s1 dtype=half
// Tensor-core GEMM for precision fp16 (glsl/linear.comp's interface): see linear_cm.glslh.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#include "linear_cm.glslh"
