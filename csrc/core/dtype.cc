#include "core/dtype.h"

namespace spmd {

int64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: case DType::kInt8: case DType::kBool: return 1;
    case DType::kFloat8_e5m2: case DType::kFloat8_e4m3fn: case DType::kFloat8_e5m2fnuz:
    case DType::kFloat8_e4m3fnuz: return 1;
    case DType::kInt16: case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kInt32: case DType::kFloat32: case DType::kComplex32: return 4;
    case DType::kInt64: case DType::kFloat64: case DType::kComplex64: return 8;
    case DType::kComplex128: return 16;
    case DType::kUndefined: return 0;
  }
  return 0;
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: return "u8";
    case DType::kInt8: return "i8";
    case DType::kInt16: return "i16";
    case DType::kInt32: return "i32";
    case DType::kInt64: return "i64";
    case DType::kFloat16: return "f16";
    case DType::kFloat32: return "f32";
    case DType::kFloat64: return "f64";
    case DType::kComplex32: return "c32";
    case DType::kComplex64: return "c64";
    case DType::kComplex128: return "c128";
    case DType::kBool: return "pred";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8_e5m2: return "f8e5m2";  // (XLA's names)
    case DType::kFloat8_e4m3fn: return "f8e4m3fn";
    case DType::kFloat8_e5m2fnuz: return "f8e5m2fnuz";
    case DType::kFloat8_e4m3fnuz: return "f8e4m3fnuz";
    case DType::kUndefined: return "undef";
  }
  return "?";
}

bool IsFloat8(DType dtype) {
  return dtype == DType::kFloat8_e5m2 || dtype == DType::kFloat8_e4m3fn ||
         dtype == DType::kFloat8_e5m2fnuz || dtype == DType::kFloat8_e4m3fnuz;
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
         dtype == DType::kBFloat16 || IsFloat8(dtype);
}

bool FloatCastIsExact(DType from, DType to) {
  if (!IsFloatingPoint(from) || !IsFloatingPoint(to)) return false;
  if (from == to || to == DType::kFloat64) return true;
  // An FP8 value (at most 3 mantissa bits, exponents within f16's and bf16's range, subnormals
  // included) is a value of every wider float.
  if (IsFloat8(from)) return !IsFloat8(to);
  return to == DType::kFloat32 && (from == DType::kFloat16 || from == DType::kBFloat16);
}

}  // namespace spmd
