// Chapter 02 — precision as data: the storage types.
// Depends on: dtype.hpp.
#include "mpt/core/dtype.hpp"

#include <stdexcept>
#include <string>

namespace mpt {

const Format& format_of(DType d) {
  // Looked up once: format_named walks the table and throws on a typo.
  static const Format& f32 = format_named("fp32");
  static const Format& bf16 = format_named("bf16");
  static const Format& f16 = format_named("fp16");
  static const Format& e4m3 = format_named("e4m3");
  static const Format& e5m2 = format_named("e5m2");
  switch (d) {
    case DType::bf16: return bf16;
    case DType::f16: return f16;
    case DType::e4m3: return e4m3;
    case DType::e5m2: return e5m2;
    case DType::f32: break;
  }
  return f32;
}

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::f32: break;
  }
  return "f32";
}

std::string dtype_names() {
  std::string s;
  for (DType d : kAllDTypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}

DType dtype_named(std::string_view name) {
  for (DType d : kAllDTypes)
    if (name == dtype_name(d) || name == format_of(d).name) return d;
  if (name == "tf32")
    throw std::invalid_argument(
        "tf32 is a compute format (fp32 storage read with 10 fraction "
        "bits), not a storage dtype; valid dtypes: " +
        dtype_names());
  throw std::invalid_argument("unknown dtype '" + std::string(name) + "'; valid dtypes: " + dtype_names() +
                              " (or the format names fp32, fp16)");
}

std::size_t bytes_per_element(DType d) {
  return static_cast<std::size_t>(format_of(d).spec.storage_bits / 8);
}

}  // namespace mpt
