// Chapter 03 — BatchNorm and LayerNorm with FP32 statistics: the formulas of
// the convolution and pooling layers (im2col, col2im, the pooling windows).
// Depends on: gemm.hpp (matmul, Op), the core tier's tensor.hpp (Mat).
//
// Written once and templated on the scalar: the layers (conv.hpp,
// pooling.hpp) run the index work in float on widened tensors, the tests run
// all of it in double and check every backward against central finite
// differences. Activations are matrices with one row per sample holding its
// C·H·W values in NCHW order (a [N, C, H, W] tensor's buffer read as
// [N, C·H·W]). Windows are square, dilation is 1, and an output size is
// floor((in + 2p − k)/s) + 1, PyTorch's with ceil_mode=False.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mpt/core/tensor.hpp"
#include "mpt/nn/cpu/gemm.hpp"

namespace mpt {

namespace conv_math {

/// A square window of `kernel`×`kernel` moved by `stride` over an input that
/// is `padding` wider on every side.
struct Window2d {
  std::int64_t kernel = 1;   ///< the window's side, >= 1
  std::int64_t stride = 1;   ///< its step, >= 1
  std::int64_t padding = 0;  ///< added on each side, >= 0
};

/// Positions of the window along one dimension of size `in`:
/// floor((in + 2p − k)/s) + 1, or 0 when the window does not fit at all.
inline std::int64_t out_size(std::int64_t in, const Window2d& w) {
  const std::int64_t span = in + 2 * w.padding - w.kernel;
  return span < 0 ? 0 : span / w.stride + 1;
}

/// The sizes of a 4-D activation and of what a window makes of it.
struct Geometry {
  std::int64_t n = 0;  ///< the input's batch N
  std::int64_t c = 0;  ///< its channels C
  std::int64_t h = 0;  ///< its rows H
  std::int64_t w = 0;  ///< its columns W
  Window2d win;        ///< the window
  /// Output rows H'.
  std::int64_t oh() const { return out_size(h, win); }
  /// Output columns W'.
  std::int64_t ow() const { return out_size(w, win); }
  /// H·W.
  std::int64_t plane() const { return h * w; }
  /// H'·W'.
  std::int64_t out_plane() const { return oh() * ow(); }
  /// C·k·k: the length of one window over all channels (a column-matrix row).
  std::int64_t patch() const { return c * win.kernel * win.kernel; }
};

// --- im2col / col2im --------------------------------------------------------------

/// The column matrix [N·H'·W', C·k·k]: row (n, oh, ow) holds the window at
/// that output position, columns ordered (c, kh, kw) as a weight
/// [out, C, k, k] is laid out, so a convolution is cols · Wᵀ. Padding reads
/// as 0. x is [N, C·H·W].
template <typename T>
Mat<T> im2col(const T* x, const Geometry& g) {
  const std::int64_t k = g.win.kernel, oh = g.oh(), ow = g.ow();
  Mat<T> cols(g.n * oh * ow, g.patch());
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t y = 0; y < oh; ++y)
      for (std::int64_t x0 = 0; x0 < ow; ++x0) {
        T* row = cols.data() + ((n * oh + y) * ow + x0) * g.patch();
        for (std::int64_t c = 0; c < g.c; ++c) {
          const T* plane = x + (n * g.c + c) * g.plane();
          for (std::int64_t i = 0; i < k; ++i) {
            const std::int64_t ih = y * g.win.stride - g.win.padding + i;
            for (std::int64_t j = 0; j < k; ++j) {
              const std::int64_t iw = x0 * g.win.stride - g.win.padding + j;
              const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
              *row++ = inside ? plane[ih * g.w + iw] : T(0);
            }
          }
        }
      }
  return cols;
}

/// im2col of a matrix x [N, C·H·W].
template <typename T>
Mat<T> im2col(const Mat<T>& x, const Geometry& g) {
  return im2col<T>(x.data(), g);
}

/// The adjoint of im2col: every entry of cols [N·H'·W', C·k·k] added back
/// into the input position it was read from (positions in the padding are
/// dropped). Returns [N, C·H·W]. Overlapping windows (stride < k) add up.
template <typename T>
Mat<T> col2im(const T* cols, const Geometry& g) {
  const std::int64_t k = g.win.kernel, oh = g.oh(), ow = g.ow();
  Mat<T> x = Mat<T>::Zero(g.n, g.c * g.plane());
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t y = 0; y < oh; ++y)
      for (std::int64_t x0 = 0; x0 < ow; ++x0) {
        const T* row = cols + ((n * oh + y) * ow + x0) * g.patch();
        for (std::int64_t c = 0; c < g.c; ++c) {
          T* plane = x.data() + (n * g.c + c) * g.plane();
          for (std::int64_t i = 0; i < k; ++i) {
            const std::int64_t ih = y * g.win.stride - g.win.padding + i;
            for (std::int64_t j = 0; j < k; ++j, ++row) {
              const std::int64_t iw = x0 * g.win.stride - g.win.padding + j;
              if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) plane[ih * g.w + iw] += *row;
            }
          }
        }
      }
  return x;
}

/// col2im of a matrix cols [N·H'·W', C·k·k].
template <typename T>
Mat<T> col2im(const Mat<T>& cols, const Geometry& g) {
  return col2im<T>(cols.data(), g);
}

/// [N·P, C] (one row per sample and position, what a GEMM over the column
/// matrix gives) to [N, C·P] (NCHW): y[n, c·P + p] = m[n·P + p, c].
template <typename T>
Mat<T> rows_to_nchw(const T* m, std::int64_t n, std::int64_t c, std::int64_t p) {
  Mat<T> y(n, c * p);
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t q = 0; q < p; ++q)
      for (std::int64_t ch = 0; ch < c; ++ch) y(b, ch * p + q) = m[(b * p + q) * c + ch];
  return y;
}

/// The inverse of rows_to_nchw: [N, C·P] (NCHW) to [N·P, C].
template <typename T>
Mat<T> nchw_to_rows(const T* y, std::int64_t n, std::int64_t c, std::int64_t p) {
  Mat<T> m(n * p, c);
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t q = 0; q < p; ++q) m(b * p + q, ch) = y[(b * c + ch) * p + q];
  return m;
}

// --- convolution ----------------------------------------------------------------------

/// Conv2d forward (groups 1, dilation 1): x [N, C·H·W], w [out, C·k·k],
/// b [1, out] (or empty: no bias) → y [N, out·H'·W'] =
/// nchw(im2col(x) · wᵀ + b).
template <typename T>
Mat<T> conv2d_forward(const Mat<T>& x, const Mat<T>& w, const Mat<T>& b, const Geometry& g) {
  Mat<T> m = matmul<T>(im2col<T>(x, g), Op::N, w, Op::T);
  if (b.size() > 0) m.rowwise() += b.row(0);
  return rows_to_nchw<T>(m.data(), g.n, w.rows(), g.out_plane());
}

/// The three gradients of a Conv2d.
template <typename T>
struct Conv2dGrads {
  Mat<T> dx;  ///< [N, C·H·W]    = col2im(rows(dy) · w)
  Mat<T> dw;  ///< [out, C·k·k]  = rows(dy)ᵀ · im2col(x)
  Mat<T> db;  ///< [1, out]      = Σ over samples and positions of dy
};

/// Conv2d backward: x [N, C·H·W], w [out, C·k·k], dy [N, out·H'·W'].
template <typename T>
Conv2dGrads<T> conv2d_backward(const Mat<T>& x, const Mat<T>& w, const Mat<T>& dy, const Geometry& g) {
  const Mat<T> d = nchw_to_rows<T>(dy.data(), g.n, w.rows(), g.out_plane());
  Conv2dGrads<T> r;
  r.dw = matmul<T>(d, Op::T, im2col<T>(x, g), Op::N);
  r.db = d.colwise().sum();
  r.dx = col2im<T>(matmul<T>(d, Op::N, w, Op::N), g);
  return r;
}

// --- pooling ----------------------------------------------------------------------------

/// The clipped extent [begin, end) of the window at output position `o`
/// along a dimension of size `in`: padding is never read.
inline void window_range(std::int64_t o, std::int64_t in, const Window2d& w, std::int64_t& begin,
                         std::int64_t& end) {
  begin = o * w.stride - w.padding;
  end = std::min(begin + w.kernel, in);
  begin = std::max<std::int64_t>(begin, 0);
}

/// Max pooling's output and, per output, where its value came from.
template <typename T>
struct MaxPool {
  Mat<T> y;                          ///< [N, C·H'·W']
  std::vector<std::int64_t> argmax;  ///< per output (row-major over y): its column in x's row
};

/// Max pooling of x [N, C·H·W], scanning each window row by row. As
/// PyTorch's CPU kernel (cpu_max_pool in aten/src/ATen/native/cpu/
/// MaxPoolKernel.cpp): the running maximum starts at −∞ on the window's
/// first position and is replaced by a value that is greater, or NaN. So of
/// equal maxima the first in scan order wins, a NaN anywhere in the window
/// makes the output NaN (the last NaN is the argmax), and padding is never a
/// candidate (it is −∞, not 0).
template <typename T>
MaxPool<T> max_pool2d_forward(const T* x, const Geometry& g) {
  const std::int64_t oh = g.oh(), ow = g.ow();
  MaxPool<T> r;
  r.y.resize(g.n, g.c * oh * ow);
  r.argmax.resize(static_cast<std::size_t>(r.y.size()));
  std::size_t out = 0;
  for (std::int64_t n = 0; n < g.n; ++n)
    for (std::int64_t c = 0; c < g.c; ++c) {
      const std::int64_t base = c * g.plane();
      const T* plane = x + n * g.c * g.plane() + base;
      for (std::int64_t y = 0; y < oh; ++y) {
        std::int64_t h0, h1;
        window_range(y, g.h, g.win, h0, h1);
        for (std::int64_t x0 = 0; x0 < ow; ++x0, ++out) {
          std::int64_t w0, w1;
          window_range(x0, g.w, g.win, w0, w1);
          T best = -std::numeric_limits<T>::infinity();
          std::int64_t at = h0 * g.w + w0;
          for (std::int64_t i = h0; i < h1; ++i)
            for (std::int64_t j = w0; j < w1; ++j) {
              const T v = plane[i * g.w + j];
              if (v > best || std::isnan(v)) {
                best = v;
                at = i * g.w + j;
              }
            }
          r.y.data()[out] = best;
          r.argmax[out] = base + at;
        }
      }
    }
  return r;
}

/// max_pool2d_forward of a matrix x [N, C·H·W].
template <typename T>
MaxPool<T> max_pool2d_forward(const Mat<T>& x, const Geometry& g) {
  return max_pool2d_forward<T>(x.data(), g);
}

/// Max pooling backward: each dy [N, C·H'·W'] goes to its window's argmax
/// (overlapping windows that share an argmax add up). Returns [N, C·H·W].
template <typename T>
Mat<T> max_pool2d_backward(const Mat<T>& dy, const std::vector<std::int64_t>& argmax, const Geometry& g) {
  Mat<T> dx = Mat<T>::Zero(g.n, g.c * g.plane());
  for (Eigen::Index n = 0; n < dy.rows(); ++n)
    for (Eigen::Index j = 0; j < dy.cols(); ++j)
      dx(n, argmax[static_cast<std::size_t>(n * dy.cols() + j)]) += dy(n, j);
  return dx;
}

/// Average pooling of x [N, C·H·W] with count_include_pad=True (PyTorch's
/// default): each window's sum over the positions inside the input,
/// divided by k·k — padding counts as zeros in the mean. (With
/// ceil_mode=False no window reaches past the padding, so PyTorch's divisor,
/// cpu_avg_pool in aten/src/ATen/native/cpu/AvgPoolKernel.cpp, is always k·k.)
/// Sums run in T in scan order, then one division.
template <typename T>
Mat<T> avg_pool2d_forward(const T* x, const Geometry& g) {
  const std::int64_t oh = g.oh(), ow = g.ow();
  const T divisor = T(g.win.kernel * g.win.kernel);
  Mat<T> y(g.n, g.c * oh * ow);
  T* out = y.data();
  for (std::int64_t nc = 0; nc < g.n * g.c; ++nc) {
    const T* plane = x + nc * g.plane();
    for (std::int64_t r = 0; r < oh; ++r) {
      std::int64_t h0, h1;
      window_range(r, g.h, g.win, h0, h1);
      for (std::int64_t q = 0; q < ow; ++q) {
        std::int64_t w0, w1;
        window_range(q, g.w, g.win, w0, w1);
        T sum = T(0);
        for (std::int64_t i = h0; i < h1; ++i)
          for (std::int64_t j = w0; j < w1; ++j) sum += plane[i * g.w + j];
        *out++ = sum / divisor;
      }
    }
  }
  return y;
}

/// avg_pool2d_forward of a matrix x [N, C·H·W].
template <typename T>
Mat<T> avg_pool2d_forward(const Mat<T>& x, const Geometry& g) {
  return avg_pool2d_forward<T>(x.data(), g);
}

/// Average pooling backward: dy [N, C·H'·W'] / (k·k) added into every input
/// position of its window. Returns [N, C·H·W].
template <typename T>
Mat<T> avg_pool2d_backward(const Mat<T>& dy, const Geometry& g) {
  const std::int64_t oh = g.oh(), ow = g.ow();
  const T divisor = T(g.win.kernel * g.win.kernel);
  Mat<T> dx = Mat<T>::Zero(g.n, g.c * g.plane());
  const T* in = dy.data();
  for (std::int64_t nc = 0; nc < g.n * g.c; ++nc) {
    T* plane = dx.data() + nc * g.plane();
    for (std::int64_t r = 0; r < oh; ++r) {
      std::int64_t h0, h1;
      window_range(r, g.h, g.win, h0, h1);
      for (std::int64_t q = 0; q < ow; ++q) {
        std::int64_t w0, w1;
        window_range(q, g.w, g.win, w0, w1);
        const T share = *in++ / divisor;
        for (std::int64_t i = h0; i < h1; ++i)
          for (std::int64_t j = w0; j < w1; ++j) plane[i * g.w + j] += share;
      }
    }
  }
  return dx;
}

}  // namespace conv_math

}  // namespace mpt
