#version 450
// variants: tile=r64n64,r32n64 w=float,i8,q4 dtype=half,f16x3
// exclude: w=i8 dtype=f16x3
// exclude: w=q4 dtype=f16x3
// linear_cmreg.comp with its matrix operations emulated from the buffers (CM_EMULATE): for tests on devices without
// cooperative matrices (lavapipe). The loads' masks and the packed weight's layout are tested; the device's element
// placement only on the device.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_KHR_shader_subgroup_basic : require
#define CM_EMULATE 1
#define REGFED 1
#include "linear_cm.glslh"
