// Chapter 02 — precision as data: DType and Tensor. Real sizes, the
// library's rounding on every write, exact widening, typed views that refuse
// a wrong dtype, shared buffers with copy on write, the per-tensor scale.
// Depends on: mpt/core/dtype.hpp, mpt/core/tensor.hpp, Chapter 1 rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/random.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/formats/rounding.hpp"

using namespace mpt;

namespace {

std::vector<float> normals(std::size_t n, std::uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

}  // namespace

TEST_CASE("DType: names, formats, sizes, parse errors") {
  CHECK(dtype_name(DType::f16) == "f16");
  CHECK(format_of(DType::f16).name == "fp16");
  CHECK(format_of(DType::bf16).name == "bf16");
  CHECK(format_of(DType::e4m3).name == "e4m3");
  CHECK(dtype_names() == "f32, bf16, f16, e4m3, e5m2");
  const std::size_t sizes[] = {4, 2, 2, 1, 1};
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(std::string(dtype_name(kAllDTypes[i])));
    CHECK(bytes_per_element(kAllDTypes[i]) == sizes[i]);
    CHECK(dtype_named(dtype_name(kAllDTypes[i])) == kAllDTypes[i]);
    CHECK(dtype_named(format_of(kAllDTypes[i]).name) == kAllDTypes[i]);  // "fp16" reads as f16
  }
  CHECK(is_fp8(DType::e5m2));
  CHECK_FALSE(is_fp8(DType::bf16));
  CHECK_THROWS_WITH_AS(
      dtype_named("fp8"),
      "unknown dtype 'fp8'; valid dtypes: f32, bf16, f16, e4m3, e5m2 (or the format names fp32, fp16)",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(dtype_named("tf32"), doctest::Contains("tf32 is a compute format"),
                       std::invalid_argument);
  // The storage types are tied to the dtypes at compile time.
  static_assert(std::is_same_v<StorageOf<DType::f16>::type, Eigen::half>);
  static_assert(DTypeOf<Fp8E5M2>::value == DType::e5m2);
}

TEST_CASE("Tensor: N-d shape, one buffer of the real size, zero-filled") {
  for (DType d : kAllDTypes) {
    CAPTURE(std::string(dtype_name(d)));
    const Tensor t(d, {8, 4, 3, 3});
    CHECK(t.dim() == 4);
    CHECK(t.numel() == 288);
    CHECK(t.size(1) == 4);
    CHECK(t.size(-1) == 3);
    CHECK(t.bytes() == 288 * bytes_per_element(d));
    std::vector<float> v(288, 1.0f);
    t.to_f32(v.data());
    for (float x : v) CHECK(bits(x) == 0u);  // +0, not -0, in every format
  }
  CHECK(shape_string({8, 4, 3, 3}) == "8x4x3x3");
  CHECK(shape_string({}) == "scalar");
  CHECK(Tensor(DType::f16, {}).numel() == 1);
  CHECK(Tensor().numel() == 0);
  CHECK_THROWS_AS(Tensor(DType::f32, {2, -1}), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Tensor(DType::f32, {2, 3}).size(2), doctest::Contains("has 2 dimension(s)"),
                       std::out_of_range);
}

TEST_CASE("Tensor: every write goes through the library's rounding, reads widen exactly") {
  const std::vector<float> x = normals(1000, 11, 1000.0);
  for (DType d : kAllDTypes) {
    CAPTURE(std::string(dtype_name(d)));
    const Tensor t = Tensor::from_f32(x.data(), {10, 100}, d);
    std::vector<float> back(x.size());
    t.to_f32(back.data());
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(bits(back[i]) == bits(round_value(x[i], format_of(d))));
    CHECK(t.value(123) == back[123]);
    const MatrixF m = t.to_matrix();
    CHECK(m(1, 23) == back[123]);
  }
  // IEEE overflow for f16 (70000 -> inf), saturation for FP8 (the format's convention).
  const float big[] = {70000.0f, 65519.0f, 1000.0f};
  const Tensor h = Tensor::from_f32(big, {3}, DType::f16);
  CHECK(std::isinf(h.value(0)));
  CHECK(h.value(1) == 65504.0f);
  CHECK(Tensor::from_f32(big, {3}, DType::e4m3).value(2) == 448.0f);
  // Options reach the rounding: toward zero.
  RoundingOptions rtz;
  rtz.mode = RoundingMode::toward_zero;
  const float third = 1.0f / 3.0f;
  CHECK(Tensor::from_f32(&third, {1}, DType::bf16, rtz).value(0) <
        Tensor::from_f32(&third, {1}, DType::bf16).value(0));
  // assign() checks the count.
  Tensor t(DType::f16, {2, 2});
  CHECK_THROWS_WITH_AS(t.assign(big, 3), doctest::Contains("3 values for a tensor of 4 elements"),
                       std::invalid_argument);
}

TEST_CASE("Tensor: typed views read in place and refuse a wrong dtype") {
  const float v[] = {1.5f, -2.0f, 0.25f, 3.0f, 8.0f, -0.5f};
  const Tensor h = Tensor::from_f32(v, {2, 3}, DType::f16);
  const ConstMatrixMap<Eigen::half> m = h.view<Eigen::half>();
  CHECK(m.rows() == 2);
  CHECK(static_cast<float>(m(1, 1)) == 8.0f);
  CHECK(static_cast<const void*>(h.data<Eigen::half>()) == h.raw());  // no copy
  CHECK_THROWS_WITH_AS(
      h.view<float>(),
      "Tensor holds f16 values; view() asked for f32 (convert with to(), or read with to_f32())",
      std::logic_error);
  CHECK_THROWS_AS(h.view<Eigen::bfloat16>(), std::logic_error);
  CHECK_THROWS_AS(h.f32(), std::logic_error);  // no writable view of a low-precision tensor
  // f32: writable in place; a 1-D tensor is one row.
  Tensor f = Tensor::from_f32(v, {6}, DType::f32);
  CHECK(f.rows() == 1);
  CHECK(f.cols() == 6);
  f.f32()(0, 2) = 5.0f;
  CHECK(f.value(2) == 5.0f);
  // 3-D tensors have no matrix view until reshaped.
  const Tensor cube(DType::f32, {2, 3, 4});
  CHECK_THROWS_WITH_AS(cube.rows(), doctest::Contains("reshape it first"), std::logic_error);
  CHECK(cube.reshaped({6, 4}).rows() == 6);
  CHECK_THROWS_AS(cube.reshaped({5, 5}), std::invalid_argument);
}

TEST_CASE("Tensor: copies share the buffer, writes copy first, clone() owns one") {
  const float v[] = {1.0f, 2.0f, 3.0f, 4.0f};
  Tensor a = Tensor::from_f32(v, {4}, DType::f32);
  Tensor b = a;
  CHECK(b.shares_storage_with(a));
  CHECK(b.storage_id() == a.storage_id());
  b.f32()(0, 0) = 9.0f;  // copy on write: a keeps its value
  CHECK_FALSE(b.shares_storage_with(a));
  CHECK(a.value(0) == 1.0f);
  CHECK(b.value(0) == 9.0f);
  const Tensor c = a.clone();
  CHECK_FALSE(c.shares_storage_with(a));
  CHECK(c.value(3) == 4.0f);
  // to() the same dtype is the same tensor; another dtype is a new one.
  CHECK(a.to(DType::f32).shares_storage_with(a));
  const Tensor h = a.to(DType::f16);
  CHECK(h.dtype() == DType::f16);
  CHECK(h.bytes() == 8);
  CHECK_FALSE(h.shares_storage_with(a));
  // The buffer is aligned for vector loads.
  CHECK(reinterpret_cast<std::uintptr_t>(a.raw()) % 64 == 0);
}

TEST_CASE("Tensor: borrowing() reads and writes memory it does not own, and copy on write still holds") {
  std::vector<float> memory = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  {
    Tensor t = Tensor::borrowing(memory.data(), {2, 3}, DType::f32);
    CHECK(t.raw() == memory.data());  // no copy
    CHECK(t.value(4) == 5.0f);
    t.f32_data()[0] = 10.0f;  // the only tensor on it: writes land in the memory
    CHECK(memory[0] == 10.0f);
    Tensor u = t;  // shared: a write through u copies first and leaves the memory alone
    u.f32_data()[1] = 20.0f;
    CHECK(memory[1] == 2.0f);
    CHECK(u.raw() != memory.data());
    CHECK(t.raw() == memory.data());
    const Tensor c = t.clone();  // clone() owns its buffer
    CHECK(c.raw() != memory.data());
    CHECK(c.value(0) == 10.0f);
  }
  // The tensors are gone and the memory was not freed by them (the vector
  // frees it; a double free would abort here under the sanitizers).
  CHECK(memory[0] == 10.0f);
  CHECK(Tensor::borrowing(nullptr, {0}, DType::f16).numel() == 0);
  CHECK_THROWS_AS(Tensor::borrowing(nullptr, {2}, DType::f32), std::invalid_argument);
  CHECK_THROWS_AS(Tensor::borrowing(memory.data(), {-1}, DType::f32), std::invalid_argument);
}

TEST_CASE("Tensor: a per-tensor scale stores x*scale and reads code/scale") {
  // 1000 is beyond e4m3's 448: unscaled it saturates, scaled by 1/4 it fits.
  const float x[] = {1000.0f, -3.0f, 0.0005f};
  const Tensor plain = Tensor::from_f32(x, {3}, DType::e4m3);
  CHECK(plain.value(0) == 448.0f);
  const Tensor scaled = Tensor::from_f32_scaled(x, {3}, DType::e4m3, 0.25f);
  CHECK(scaled.scale() == 0.25f);
  CHECK(scaled.value(0) == 1024.0f);  // stored 256 = 2^8, read back times 4
  CHECK(scaled.value(1) == -3.0f);
  CHECK(scaled.bytes() == 3);
  // Without the scale the tiny value flushes; with a large scale it survives.
  const Tensor up = Tensor::from_f32_scaled(x, {3}, DType::e4m3, 1024.0f);
  CHECK(Tensor::from_f32(x, {3}, DType::e4m3).value(2) == 0.0f);
  CHECK(up.value(2) != 0.0f);
  CHECK(std::fabs(up.value(2) - 0.0005f) < 0.0005f * 0.07f);  // within e4m3's relative spacing
  // to() drops the scale by rounding the read values.
  const Tensor f = scaled.to(DType::f32);
  CHECK_FALSE(f.scale().has_value());
  CHECK(f.value(0) == 1024.0f);
  CHECK_THROWS_AS(Tensor::from_f32_scaled(x, {3}, DType::e4m3, 0.0f), std::invalid_argument);
  CHECK_THROWS_AS(Tensor::from_f32_scaled(x, {3}, DType::e4m3, INFINITY), std::invalid_argument);
}
