// Chapter 02 exercises — YOUR FILE: write the three functions of ex02.hpp here.
// Depends on: ex02.hpp (the specification) and the C++ standard library.
// Each function throws until you replace its body; the grader reports the
// exercise as "not implemented" until then. See README.md for how to grade.
#include "ex02.hpp"

#include <cmath>  // std::isfinite, std::sqrt
#include <stdexcept>

namespace mpt::ex02 {

void update_scale(float& scale, std::int32_t& growth_tracker, bool found_inf, double growth_factor,
                  double backoff_factor, std::int32_t growth_interval) {
  (void)scale;
  (void)growth_tracker;
  (void)found_inf;
  (void)growth_factor;
  (void)backoff_factor;
  (void)growth_interval;
  throw std::logic_error("exercise 2.1 not implemented");
}

bool unscale_and_check(float* g, std::size_t n, float inv_scale) {
  (void)g;
  (void)n;
  (void)inv_scale;
  throw std::logic_error("exercise 2.2 not implemented");
}

ClipResult unscale_and_clip(const std::vector<GradTensor>& grads, float inv_scale, double max_norm) {
  (void)grads;
  (void)inv_scale;
  (void)max_norm;
  throw std::logic_error("exercise 2.3 not implemented");
}

}  // namespace mpt::ex02
