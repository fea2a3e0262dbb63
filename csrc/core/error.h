// Error helpers for the torch-free layers. ValueError-kind problems (bad user input) throw
// std::invalid_argument, everything else std::runtime_error; pybind11 maps them to Python's
// ValueError and RuntimeError, and the ATen layer rethrows them as c10 errors.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace spmd {

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Raised for resource exhaustion on an emulated device (bytes over capacity).
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace spmd

#define SPMD_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) throw std::runtime_error(::spmd::StrCat(__VA_ARGS__));              \
  } while (0)

#define SPMD_CHECK_VALUE(cond, ...)                                                  \
  do {                                                                               \
    if (!(cond)) throw std::invalid_argument(::spmd::StrCat(__VA_ARGS__));           \
  } while (0)

#define SPMD_FAIL(...) throw std::runtime_error(::spmd::StrCat(__VA_ARGS__))
