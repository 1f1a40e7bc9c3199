#version 450
// variants: tile=m64n64k64,m32n64k64,m64n128k32,m32n32k64,m16n64k64,m32n64k32,m64n64k32,m128n64k32,m128n128k32,m64n64k32w8,m64n128k32w8,m128n64k32w8,m32n128k32w8,m64n64k16,m32n64k16,m64n128k16,m64n64k32s1,m64n128k32s1 dtype=half
// linear_cm.glslh with its three matrix operations (load, multiply-add, store) emulated by plain
// shared-memory code: for tests on devices without cooperative matrices (lavapipe), and to tell a
// cooperative-matrix problem from a tiling one on devices that have them. Not a production path.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#define CM_EMULATE 1
#include "linear_cm.glslh"
