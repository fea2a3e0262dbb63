// Every rule family registers here (called once, before the first rule lookup).
#pragma once

namespace spmd::partition {
void RegisterPointwiseRules();
void RegisterReductionRules();
void RegisterMatmulRules();
void RegisterViewRules();
void RegisterNNRules();
void RegisterBatchNormRules();
void RegisterIndexRules();
void RegisterAdvancedIndexRules();  // advanced_index.cc
void RegisterConvRules();  // conv.cc
void RegisterPoolRules();  // pool.cc
void RegisterForeachRules();  // foreach.cc
void RegisterAttentionRules();  // attention.cc
void RegisterGroupedMmRules();  // grouped_mm.cc
void RegisterSoftmaxRules();  // softmax.cc
void RegisterShiftRules();  // shift.cc
void RegisterAllRules();  // calls all of the above once
}  // namespace spmd::partition
