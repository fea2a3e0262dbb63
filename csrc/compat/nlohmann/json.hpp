// Stand-in for nlohmann/json, used only where torch's headers include it but the torch install
// does not ship it (PyPI wheels as of torch 2.13: ATen/functorch/Interpreter.h includes it for
// Interpreter::serialize/deserialize). torch_spmd never (de)serializes functorch interpreters;
// these inline functions only need to compile. CMakeLists.txt adds this directory to the
// include path when the real header is missing.
#pragma once
#include <stdexcept>
#include <string>

namespace nlohmann {

class json {
 public:
  template <typename T>
  explicit json(const T&) {
    Unavailable();
  }
  std::string dump() const { Unavailable(); }
  static json parse(const std::string&) { Unavailable(); }
  template <typename T>
  T get() const {
    Unavailable();
  }

 private:
  [[noreturn]] static void Unavailable() {
    throw std::logic_error("functorch interpreter (de)serialization is not available in torch_spmd");
  }
};

}  // namespace nlohmann
