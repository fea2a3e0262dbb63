// Kernels for the ops that move data between the host and the devices (named_ops.cc says which
// op each serves). Host->device copies take a copy of the host value at once (recording them
// would capture the user's host tensor by reference, and it may change), held on the host until
// used or annotated (DeviceData::HeldOnHost); device->host copies materialize; device->device
// copies are recorded like any op. Tensors of other devices (cuda, ...) travel through the host,
// both ways.
#pragma once
#include "aten/op_plan.h"

namespace spmd::aten {

void ToCopy(OpPlan& plan, torch::jit::Stack* stack);            // _to_copy
void CopyInPlace(OpPlan& plan, torch::jit::Stack* stack);       // copy_
void CopyFunctional(OpPlan& plan, torch::jit::Stack* stack);    // copy
void CopyFrom(OpPlan& plan, torch::jit::Stack* stack);          // _copy_from(_and_resize)
void LocalScalarDense(OpPlan& plan, torch::jit::Stack* stack);  // item()
void Resize(OpPlan& plan, torch::jit::Stack* stack);            // resize_
// Ops whose result is their input's value (detach_copy, alias_copy, lift_fresh(_copy)).
void SameValue(OpPlan& plan, torch::jit::Stack* stack);
// clone: the clone of a tensor the user annotated carries the annotation.
void CloneKeepingAnnotation(OpPlan& plan, torch::jit::Stack* stack);

}  // namespace spmd::aten
