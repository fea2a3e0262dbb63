#include "ir/arg.h"

#include <cstdio>

namespace spmd::ir {

Hash Arg::hash() const {
  Hash h = HashInt(static_cast<int64_t>(kind) * 4 + (dynamic ? 1 : 0) + (wrapped ? 2 : 0));
  // A dynamic list's values are run-time inputs; its length and element kinds are not.
  if (dynamic) return kind == Kind::kScalarList ? HashCombine(h, HashInts(ints)) : h;
  switch (kind) {
    case Kind::kDouble:
    case Kind::kScalarDouble:
      return HashCombine(h, HashDouble(d));
    case Kind::kIntList:
    case Kind::kBoolList:
    case Kind::kTensorList:
    case Kind::kOptTensorList:
      return HashCombine(h, HashInts(ints));
    case Kind::kDoubleList:
      for (double v : doubles) h = HashCombine(h, HashDouble(v));
      return h;
    case Kind::kString:
      return HashCombine(h, HashString(s));
    default:
      return HashCombine(h, HashInt(i));
  }
}

namespace {
std::string FormatDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}
std::string JoinInts(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t k = 0; k < v.size(); ++k) s += (k ? "," : "") + std::to_string(v[k]);
  return s + "]";
}
}  // namespace

std::string Arg::ToString() const {
  std::string prefix = dynamic ? "$" : "";  // '$' marks a run-time scalar
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: case Kind::kScalarBool: return prefix + (i ? "True" : "False");
    case Kind::kInt: case Kind::kScalarInt: return prefix + std::to_string(i);
    case Kind::kDouble: case Kind::kScalarDouble: return prefix + FormatDouble(d);
    case Kind::kIntList: case Kind::kBoolList: return JoinInts(ints);
    case Kind::kDoubleList:
    case Kind::kScalarList: {
      std::string s = kind == Kind::kScalarList ? prefix + "[" : "[";
      for (size_t k = 0; k < doubles.size(); ++k) s += (k ? "," : "") + FormatDouble(doubles[k]);
      return s + "]";
    }
    case Kind::kString: return "\"" + s + "\"";
    case Kind::kTensor: return "%in" + std::to_string(i);
    case Kind::kTensorList: case Kind::kOptTensorList: return "list" + JoinInts(ints);
    case Kind::kScalarType: return "dtype=" + std::to_string(i);
    case Kind::kLayout: return "layout=" + std::to_string(i);
    case Kind::kDevice: return "device";
    case Kind::kMemoryFormat: return "memory_format=" + std::to_string(i);
  }
  return "?";
}

bool Arg::operator==(const Arg& o) const {
  return kind == o.kind && dynamic == o.dynamic && wrapped == o.wrapped && i == o.i && d == o.d && ints == o.ints &&
         doubles == o.doubles && s == o.s;
}

}  // namespace spmd::ir
