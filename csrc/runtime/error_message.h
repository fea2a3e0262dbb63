// What a user reads of an exception: a c10::Error without the C++ backtrace its what() carries,
// unless TORCH_SHOW_CPP_STACKTRACES asks for it, as torch's own Python bindings show it.
#pragma once
#include <c10/util/Exception.h>
#include <torch/csrc/utils/cpp_stacktraces.h>

#include <exception>
#include <string>

namespace spmd::runtime {

inline const char* UserMessage(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return torch::get_cpp_stacktraces_enabled() ? c10_error->what()
                                                : c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace spmd::runtime
