// Shape functions (named_ops.cc says which op each serves) for ops whose torch 2.x meta kernel
// disagrees with the CPU kernel the devices run, and meta kernels for the fused optimizer steps
// torch ships none for.
#pragma once
#include "aten/op_plan.h"

namespace spmd::aten {

std::vector<TensorType> BatchNorm(const c10::OperatorHandle& op,
                                  const std::vector<c10::IValue>& meta_args);
std::vector<TensorType> EmbeddingBag(const c10::OperatorHandle& op,
                                     const std::vector<c10::IValue>& meta_args);
std::vector<TensorType> NativeLayerNorm(const c10::OperatorHandle& op,
                                        const std::vector<c10::IValue>& meta_args);
std::vector<TensorType> FlashAttentionForCpu(const c10::OperatorHandle& op,
                                             const std::vector<c10::IValue>& meta_args);

std::vector<TensorType> ScaledMm(const c10::OperatorHandle& op,
                                 const std::vector<c10::IValue>& meta_args);
std::vector<TensorType> GroupedMm(const c10::OperatorHandle& op,
                                  const std::vector<c10::IValue>& args);

// Registers a meta kernel for each fused optimizer step (_fused_sgd, ...) that has none.
void RegisterMissingMetaKernels();

}  // namespace spmd::aten
