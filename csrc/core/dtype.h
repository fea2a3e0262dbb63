// Element types, mirrored from c10::ScalarType so the torch-free layers can reason about bytes
// and names. The numeric values are identical to c10's, so the ATen layer converts with a cast.
#pragma once
#include <cstdint>
#include <string>

namespace spmd {

enum class DType : int8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kComplex32 = 8,
  kComplex64 = 9,
  kComplex128 = 10,
  kBool = 11,
  kBFloat16 = 15,
  // FP8 (OCP's E5M2 and E4M3, and the fnuz variants without negative zero or infinities).
  kFloat8_e5m2 = 23,
  kFloat8_e4m3fn = 24,
  kFloat8_e5m2fnuz = 25,
  kFloat8_e4m3fnuz = 26,
  kUndefined = 127,
};

int64_t ElementSize(DType dtype);
std::string DTypeName(DType dtype);  // "f32", "bf16", "i64", ...
bool IsFloatingPoint(DType dtype);  // FP8 included, as torch.is_floating_point
bool IsFloat8(DType dtype);
// Whether converting a floating `from` to floating `to` is exact for every value: a type holds
// itself, f32 and f64 hold f16 and bf16, f64 holds f32. (f16 and bf16 hold each other neither
// way: bf16 has more range, f16 more precision.)
bool FloatCastIsExact(DType from, DType to);

}  // namespace spmd
