#include "core/dtype.h"

namespace spmd {

int64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: case DType::kInt8: case DType::kBool: return 1;
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
    case DType::kUndefined: return "undef";
  }
  return "?";
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
         dtype == DType::kBFloat16;
}

bool FloatCastIsExact(DType from, DType to) {
  if (!IsFloatingPoint(from) || !IsFloatingPoint(to)) return false;
  if (from == to || to == DType::kFloat64) return true;
  return to == DType::kFloat32 && (from == DType::kFloat16 || from == DType::kBFloat16);
}

}  // namespace spmd
