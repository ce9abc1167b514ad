// Chapter 02 — loss scaling and FP32 master weights: the Optimizer interface.
// Depends on: optimizer.hpp.
#include "mpt/optim/optimizer.hpp"

#include <sstream>
#include <stdexcept>

namespace mpt {

void Optimizer::check_grad_shape(const Parameter& p) {
  if (p.grad.shape() != p.master.shape() || p.grad.dtype() != DType::f32)
    throw std::invalid_argument("parameter " + p.name + ": grad is " + shape_string(p.grad.shape()) + " " +
                                std::string(dtype_name(p.grad.dtype())) + " but the weights are " +
                                shape_string(p.master.shape()) + " f32");
}

namespace detail {

std::string option_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void require_option(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

}  // namespace detail

}  // namespace mpt
