// Chapter 02 — precision as data: the Tensor.
// Depends on: dtype.hpp; Chapter 1's formats tier (rounding.hpp, storage.hpp:
// every value written goes through the library's rounding), Eigen.
//
// A Tensor is an N-d shape, a dtype, ONE contiguous buffer of exactly
// numel × bytes_per_element bytes (an f16 tensor really occupies 2 bytes an
// element, an FP8 tensor 1), and an optional per-tensor scale (Chapter 7's
// FP8 recipes). Compute reads it through Eigen maps: f32 data in place,
// other dtypes widened to f32 first (exact). Writes go through the library's
// rounding (round-to-nearest-even by default); the only writable Eigen view
// is the f32 one, so no value can be stored into a low-precision tensor
// without being rounded by mpt.
//
// Copies are cheap and share the buffer, as PyTorch tensors share storage;
// a write through a copy first gives it a buffer of its own (copy on write),
// so a Tensor still behaves as a value. Sharing is what lets a model count
// the bytes it keeps for backward without counting one buffer twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "mpt/core/dtype.hpp"
#include "mpt/formats/rounding.hpp"

namespace mpt {

/// A tensor's shape: sizes, outermost first (N, C, H, W). {} is a scalar.
using Shape = std::vector<std::int64_t>;
/// Elements in a shape (1 for a scalar).
std::int64_t numel(const Shape& shape);
/// "128x256", "8x4x3x3", "scalar" — for messages.
std::string shape_string(const Shape& shape);

/// Row-major matrix of any scalar: the layer math is written once over it
/// and runs in float (training) and double (the finite-difference checks).
template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Row-major FP32 matrix (data sets, FP32 scratch).
using MatrixF = Mat<float>;
/// A read-only Eigen view of a tensor's elements as a row-major matrix.
template <typename T>
using ConstMatrixMap = Eigen::Map<const Mat<T>>;
/// A writable Eigen view (f32 tensors only).
using MatrixMapF = Eigen::Map<MatrixF>;

namespace detail {
/// One tensor buffer: 64-byte aligned, uninitialised until written.
class Storage {
 public:
  /// `bytes` bytes (0 allowed).
  explicit Storage(std::size_t bytes);
  /// `bytes` bytes at `borrowed`, which the caller owns and keeps alive: not
  /// freed here (Tensor::borrowing).
  Storage(unsigned char* borrowed, std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;             ///< shared through std::shared_ptr only
  Storage& operator=(const Storage&) = delete;  ///< shared through std::shared_ptr only
  /// The first byte.
  unsigned char* data() { return data_; }
  /// The first byte.
  const unsigned char* data() const { return data_; }
  /// The size in bytes.
  std::size_t size() const { return size_; }
  /// A number no other buffer state has had: taken at construction and
  /// again at every write access (touch()), from one process-wide counter.
  std::uint64_t version() const { return version_; }
  /// Mark the contents as (about to be) changed: a new version().
  void touch();

 private:
  unsigned char* data_ = nullptr;
  std::uint64_t version_ = 0;
  std::size_t size_ = 0;
  bool owned_ = true;
};
}  // namespace detail

/// An N-d array of one dtype in one buffer of its real size.
class Tensor {
 public:
  /// An empty f32 tensor of shape {0}.
  Tensor();
  /// A zero-filled tensor (all-zero bits are +0 in every dtype). Throws
  /// std::invalid_argument for a negative size.
  Tensor(DType dtype, Shape shape);
  /// A tensor whose elements are not initialised: for ops that write every
  /// element before anything reads it.
  static Tensor uninitialized(DType dtype, Shape shape);
  /// numel(shape) floats rounded into dtype (options: Chapter 1's rounding).
  static Tensor from_f32(const float* values, Shape shape, DType dtype, const RoundingOptions& options = {});
  /// A row-major FP32 matrix, shape {rows, cols}, rounded into dtype.
  static Tensor from_matrix(const Eigen::Ref<const MatrixF>& m, DType dtype);
  /// A tensor whose numel(shape) elements `fill` writes as dtype's bit
  /// patterns (codes, e.g. the uint16 of an f16) into the buffer it is
  /// given: nothing is rounded, since every pattern is a value of its dtype.
  /// For ops that are exact on codes (ReLU keeps each element or gives +0).
  static Tensor from_codes(Shape shape, DType dtype, const std::function<void(void* codes)>& fill);
  /// A tensor over `memory` (numel × element bytes), which the caller owns
  /// and keeps alive while this tensor, or a copy of it, reads it: no
  /// allocation, no copy. Copy on write holds as for any tensor (a write
  /// through one of two tensors that share the memory gives that one a
  /// buffer of its own, and it no longer writes into `memory`). Chapter 5's
  /// DDP keeps the gradients as views of its communication buckets so.
  /// Throws std::invalid_argument for a negative size, or a null `memory`
  /// with elements.
  static Tensor borrowing(void* memory, Shape shape, DType dtype);
  /// values × scale rounded into dtype, with the scale kept: the stored codes
  /// hold x·scale and every read returns code·(1/scale) — per-tensor scaling
  /// as Transformer Engine does it for FP8. Throws std::invalid_argument
  /// unless the scale is finite and > 0.
  static Tensor from_f32_scaled(const float* values, Shape shape, DType dtype, float scale,
                                const RoundingOptions& options = {});

  /// The storage type of the elements.
  DType dtype() const noexcept { return dtype_; }
  /// The sizes, outermost first.
  const Shape& shape() const noexcept { return shape_; }
  /// Number of dimensions.
  int dim() const noexcept { return static_cast<int>(shape_.size()); }
  /// Size of dimension d; negative d counts from the end. Throws
  /// std::out_of_range for a dimension the tensor does not have.
  std::int64_t size(int d) const;
  /// Number of elements.
  std::int64_t numel() const noexcept { return numel_; }
  /// Bytes of the element buffer: numel × bytes_per_element(dtype) — what is allocated.
  std::size_t bytes() const noexcept;
  /// The per-tensor scale, if one was set (see from_f32_scaled).
  std::optional<float> scale() const noexcept { return scale_; }

  /// Rows of the matrix view: size(0) of a 2-D tensor, 1 of a 1-D one.
  std::int64_t rows() const;
  /// Columns of the matrix view: size(1) of a 2-D tensor, size(0) of a 1-D one.
  std::int64_t cols() const;

  // --- reading ----------------------------------------------------------------

  /// Every element widened to f32 into out[0..numel) (exact; vectorized),
  /// the scale undone when there is one.
  void to_f32(float* out) const;
  /// The matrix view widened to f32 (a copy). 1-D and 2-D tensors only.
  MatrixF to_matrix() const;
  /// Element i of the flattened tensor, widened to f32.
  float value(std::int64_t i) const;
  /// This tensor in dtype d: the same buffer when d is already its dtype and
  /// there is no scale, else a new tensor rounded into d (RNE, d's overflow
  /// convention unless options say otherwise).
  Tensor to(DType d, const RoundingOptions& options = {}) const;

  /// A read-only Eigen view of the elements as a row-major matrix (see
  /// rows(), cols()) in their storage type T. T must be the storage type of
  /// the tensor's dtype: any other storage type throws std::logic_error
  /// naming both, and a type that is no storage type does not compile.
  template <class T>
  ConstMatrixMap<T> view() const {
    require_storage(DTypeOf<T>::value, "view");
    return ConstMatrixMap<T>(reinterpret_cast<const T*>(raw()), rows(), cols());
  }
  /// The elements in their storage type T (checked as view() is).
  template <class T>
  const T* data() const {
    require_storage(DTypeOf<T>::value, "data");
    return reinterpret_cast<const T*>(raw());
  }
  /// view<float>(): an f32 tensor read in place.
  ConstMatrixMap<float> f32() const { return view<float>(); }
  /// A writable f32 view (f32 tensors only: writes into other dtypes must
  /// round, see assign()). Gives the tensor its own buffer first if it shares one.
  MatrixMapF f32();
  /// Writable f32 elements (f32 only, own buffer first, as f32()).
  float* f32_data();
  /// Read-only f32 elements.
  const float* f32_data() const { return data<float>(); }

  // --- writing ------------------------------------------------------------------

  /// Replace every element by values[i] rounded into the dtype (the scale, if
  /// any, applied first). Throws std::invalid_argument unless n == numel().
  void assign(const float* values, std::int64_t n, const RoundingOptions& options = {});
  /// Become {rows, cols} with m's values rounded into the dtype (the scale
  /// is dropped).
  void assign(const Eigen::Ref<const MatrixF>& m);
  /// Set every element to +0.
  void fill_zero();

  // --- storage --------------------------------------------------------------------

  /// The same elements under another shape with the same numel (shares the
  /// buffer). Throws std::invalid_argument otherwise.
  Tensor reshaped(Shape shape) const;
  /// A copy with a buffer of its own.
  Tensor clone() const;
  /// True when both tensors read one buffer.
  bool shares_storage_with(const Tensor& other) const noexcept;
  /// An identity for the buffer (nullptr when empty): equal for tensors that share it.
  const void* storage_id() const noexcept { return storage_.get(); }
  /// The first byte of the buffer (for kernels that take typed codes).
  const void* raw() const noexcept;
  /// Chapter 6: the contents' version, PyTorch's tensor._version made
  /// unique: it changes at every write access (f32(), f32_data(), assign(),
  /// fill_zero(), a copy on write) and no two buffer states share one, so an
  /// equal version means the same elements (0: no buffer). The weight cast
  /// cache (Parameter::read) uses it to know when the master has changed.
  std::uint64_t version() const noexcept;

 private:
  static Tensor without_storage(DType dtype, Shape shape);  // shape checked, no buffer yet
  void require_storage(DType want, const char* call) const;
  unsigned char* mutable_raw();  // own buffer first (copy on write)
  DType dtype_ = DType::f32;
  Shape shape_{0};
  std::int64_t numel_ = 0;
  std::optional<float> scale_;
  std::shared_ptr<detail::Storage> storage_;
};

/// n floats rounded into dtype d, written to out as d's storage type
/// (memcpy for f32). The one conversion every Tensor write goes through.
void store_as(DType d, const float* in, void* out, std::size_t n, const RoundingOptions& o = {});
/// n elements of dtype d widened to f32 (exact).
void load_from(DType d, const void* in, float* out, std::size_t n);

/// Every element of t widened to f32 (exact), as a vector: what a layer's
/// FP32 compute reads.
inline std::vector<float> widened(const Tensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  t.to_f32(v.data());
  return v;
}

}  // namespace mpt
