// Chapter 02 — precision as data: the Tensor.
// Depends on: tensor.hpp; Chapter 1's storage conversions (to_fp16 & co.,
// vectorized where the CPU allows), so a stored value is always exactly
// round_value(x) of the library's rounding.
#include "mpt/core/tensor.hpp"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "mpt/formats/storage.hpp"

namespace mpt {

std::int64_t numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  return n;
}

std::string shape_string(const Shape& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

namespace detail {

namespace {
std::atomic<std::uint64_t> g_next_version{1};  // 0 is "no buffer"
std::uint64_t next_version() { return g_next_version.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

Storage::Storage(std::size_t bytes) : version_(next_version()), size_(bytes) {
  if (bytes == 0) return;
  // 64-byte alignment: full cache lines and aligned AVX loads for Eigen.
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  data_ = static_cast<unsigned char*>(std::aligned_alloc(64, rounded));
  if (!data_) throw std::bad_alloc();
}

Storage::Storage(unsigned char* borrowed, std::size_t bytes)
    : data_(borrowed), version_(next_version()), size_(bytes), owned_(false) {}

void Storage::touch() { version_ = next_version(); }

Storage::~Storage() {
  if (owned_) std::free(data_);
}

}  // namespace detail

void store_as(DType d, const float* in, void* out, std::size_t n, const RoundingOptions& o) {
  switch (d) {
    case DType::f32: {
      // f32 to f32 rounds nothing unless the options ask for something an
      // fp32 value can still change under (flushing subnormals).
      if (o.subnormals == SubnormalMode::keep) {
        if (n) std::memcpy(out, in, n * sizeof(float));
      } else {
        round_array(in, static_cast<float*>(out), n, format_of(DType::f32), o);
      }
      return;
    }
    case DType::bf16: to_bf16(in, static_cast<Eigen::bfloat16*>(out), n, o); return;
    case DType::f16: to_fp16(in, static_cast<Eigen::half*>(out), n, o); return;
    case DType::e4m3: to_e4m3(in, static_cast<Fp8E4M3*>(out), n, o); return;
    case DType::e5m2: to_e5m2(in, static_cast<Fp8E5M2*>(out), n, o); return;
  }
}

void load_from(DType d, const void* in, float* out, std::size_t n) {
  switch (d) {
    case DType::f32:
      if (n) std::memcpy(out, in, n * sizeof(float));
      return;
    case DType::bf16: from_bf16(static_cast<const Eigen::bfloat16*>(in), out, n); return;
    case DType::f16: from_fp16(static_cast<const Eigen::half*>(in), out, n); return;
    case DType::e4m3: from_e4m3(static_cast<const Fp8E4M3*>(in), out, n); return;
    case DType::e5m2: from_e5m2(static_cast<const Fp8E5M2*>(in), out, n); return;
  }
}

// --- construction ----------------------------------------------------------------

Tensor::Tensor() = default;

Tensor Tensor::without_storage(DType dtype, Shape shape) {
  for (std::int64_t s : shape)
    if (s < 0) throw std::invalid_argument("Tensor: shape " + shape_string(shape) + " has a negative size");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.numel_ = mpt::numel(t.shape_);
  return t;
}

Tensor Tensor::uninitialized(DType dtype, Shape shape) {
  Tensor t = without_storage(dtype, std::move(shape));
  if (t.numel_ > 0) t.storage_ = std::make_shared<detail::Storage>(t.bytes());
  return t;
}

Tensor Tensor::borrowing(void* memory, Shape shape, DType dtype) {
  Tensor t = without_storage(dtype, std::move(shape));
  if (t.numel_ > 0) {
    if (memory == nullptr)
      throw std::invalid_argument("Tensor::borrowing: no memory (nullptr) for " + std::to_string(t.numel_) +
                                  " elements of shape " + shape_string(t.shape_));
    t.storage_ = std::make_shared<detail::Storage>(static_cast<unsigned char*>(memory), t.bytes());
  }
  return t;
}

Tensor::Tensor(DType dtype, Shape shape) : Tensor(uninitialized(dtype, std::move(shape))) {
  if (storage_) std::memset(storage_->data(), 0, storage_->size());
}

Tensor Tensor::from_f32(const float* values, Shape shape, DType dtype, const RoundingOptions& options) {
  Tensor t = uninitialized(dtype, std::move(shape));
  if (t.storage_) store_as(dtype, values, t.storage_->data(), static_cast<std::size_t>(t.numel_), options);
  return t;
}

Tensor Tensor::from_codes(Shape shape, DType dtype, const std::function<void(void* codes)>& fill) {
  Tensor t = uninitialized(dtype, std::move(shape));
  if (t.storage_) fill(t.storage_->data());
  return t;
}

Tensor Tensor::from_matrix(const Eigen::Ref<const MatrixF>& m, DType dtype) {
  Tensor t = uninitialized(dtype, {m.rows(), m.cols()});
  t.assign(m);
  return t;
}

Tensor Tensor::from_f32_scaled(const float* values, Shape shape, DType dtype, float scale,
                               const RoundingOptions& options) {
  if (!(std::isfinite(scale) && scale > 0.0f))
    throw std::invalid_argument("Tensor::from_f32_scaled: the scale must be finite and > 0, got " +
                                std::to_string(scale));
  Tensor t = uninitialized(dtype, std::move(shape));
  t.scale_ = scale;
  t.assign(values, t.numel_, options);
  return t;
}

// --- shape -------------------------------------------------------------------------

std::int64_t Tensor::size(int d) const {
  const int n = dim();
  const int i = d < 0 ? d + n : d;
  if (i < 0 || i >= n)
    throw std::out_of_range("Tensor::size(" + std::to_string(d) + "): the tensor has " + std::to_string(n) +
                            " dimension(s) (shape " + shape_string(shape_) + ")");
  return shape_[static_cast<std::size_t>(i)];
}

std::size_t Tensor::bytes() const noexcept {
  return static_cast<std::size_t>(numel_) * bytes_per_element(dtype_);
}

std::int64_t Tensor::rows() const {
  if (dim() == 2) return shape_[0];
  if (dim() == 1) return 1;
  throw std::logic_error("a matrix view needs a 1-D or 2-D tensor; this one is " + shape_string(shape_) +
                         " (reshape it first)");
}

std::int64_t Tensor::cols() const {
  if (dim() == 2) return shape_[1];
  if (dim() == 1) return shape_[0];
  throw std::logic_error("a matrix view needs a 1-D or 2-D tensor; this one is " + shape_string(shape_) +
                         " (reshape it first)");
}

// --- reading -------------------------------------------------------------------------

const void* Tensor::raw() const noexcept { return storage_ ? storage_->data() : nullptr; }

std::uint64_t Tensor::version() const noexcept { return storage_ ? storage_->version() : 0; }

void Tensor::require_storage(DType want, const char* call) const {
  if (want != dtype_)
    throw std::logic_error("Tensor holds " + std::string(dtype_name(dtype_)) + " values; " + call +
                           "() asked for " + std::string(dtype_name(want)) +
                           " (convert with to(), or read with to_f32())");
}

void Tensor::to_f32(float* out) const {
  const auto n = static_cast<std::size_t>(numel_);
  if (n == 0) return;
  load_from(dtype_, raw(), out, n);
  if (scale_) {
    const float inv = 1.0f / *scale_;
    for (std::size_t i = 0; i < n; ++i) out[i] *= inv;
  }
}

MatrixF Tensor::to_matrix() const {
  MatrixF m(rows(), cols());
  to_f32(m.data());
  return m;
}

float Tensor::value(std::int64_t i) const {
  if (i < 0 || i >= numel_)
    throw std::out_of_range("Tensor::value(" + std::to_string(i) + "): the tensor has " +
                            std::to_string(numel_) + " elements");
  float v = 0;
  load_from(
      dtype_,
      static_cast<const unsigned char*>(raw()) + static_cast<std::size_t>(i) * bytes_per_element(dtype_), &v,
      1);
  return scale_ ? v * (1.0f / *scale_) : v;
}

Tensor Tensor::to(DType d, const RoundingOptions& options) const {
  if (d == dtype_ && !scale_) return *this;
  if (dtype_ == DType::f32 && !scale_) return from_f32(f32_data(), shape_, d, options);
  std::vector<float> wide(static_cast<std::size_t>(numel_));
  to_f32(wide.data());
  return from_f32(wide.data(), shape_, d, options);
}

// --- writing ---------------------------------------------------------------------------

unsigned char* Tensor::mutable_raw() {
  if (storage_ && storage_.use_count() > 1) {
    auto own = std::make_shared<detail::Storage>(storage_->size());
    std::memcpy(own->data(), storage_->data(), storage_->size());
    storage_ = std::move(own);
  }
  if (!storage_) return nullptr;
  storage_->touch();
  return storage_->data();
}

MatrixMapF Tensor::f32() {
  require_storage(DType::f32, "f32");
  const std::int64_t r = rows(), c = cols();
  return MatrixMapF(reinterpret_cast<float*>(mutable_raw()), r, c);
}

float* Tensor::f32_data() {
  require_storage(DType::f32, "f32_data");
  return reinterpret_cast<float*>(mutable_raw());
}

void Tensor::assign(const float* values, std::int64_t n, const RoundingOptions& options) {
  if (n != numel_)
    throw std::invalid_argument("Tensor::assign: " + std::to_string(n) + " values for a tensor of " +
                                std::to_string(numel_) + " elements (shape " + shape_string(shape_) + ")");
  if (n == 0) return;
  unsigned char* out = mutable_raw();
  if (scale_) {
    std::vector<float> scaled(values, values + n);
    for (float& v : scaled) v *= *scale_;
    store_as(dtype_, scaled.data(), out, static_cast<std::size_t>(n), options);
  } else {
    store_as(dtype_, values, out, static_cast<std::size_t>(n), options);
  }
}

void Tensor::assign(const Eigen::Ref<const MatrixF>& m) {
  const Shape shape{m.rows(), m.cols()};
  if (shape != shape_ || !storage_ || storage_.use_count() > 1) *this = uninitialized(dtype_, shape);
  scale_.reset();
  if (numel_ == 0) return;
  if (m.outerStride() == m.cols()) {
    store_as(dtype_, m.data(), storage_->data(), static_cast<std::size_t>(numel_));
  } else {
    const MatrixF dense = m;  // a block of a larger matrix: make it contiguous first
    store_as(dtype_, dense.data(), storage_->data(), static_cast<std::size_t>(numel_));
  }
}

void Tensor::fill_zero() {
  if (unsigned char* p = mutable_raw()) std::memset(p, 0, storage_->size());
}

// --- storage -------------------------------------------------------------------------------

Tensor Tensor::reshaped(Shape shape) const {
  if (mpt::numel(shape) != numel_)
    throw std::invalid_argument("Tensor::reshaped: " + shape_string(shape_) + " (" + std::to_string(numel_) +
                                " elements) cannot become " + shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = *this;
  if (storage_) {
    t.storage_ = std::make_shared<detail::Storage>(storage_->size());
    std::memcpy(t.storage_->data(), storage_->data(), storage_->size());
  }
  return t;
}

bool Tensor::shares_storage_with(const Tensor& other) const noexcept {
  return storage_ && storage_ == other.storage_;
}

}  // namespace mpt
