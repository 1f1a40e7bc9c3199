#version 450
// variants: tile=m64n64k32s1,m64n128k32s1 w=float,i8 dtype=half
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
