// Precompiled header for the torch-dependent translation units (runtime executor, ATen layer,
// Python bindings): parsing these headers dominates their compile time.
#pragma once
#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>
