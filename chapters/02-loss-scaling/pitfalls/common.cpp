// Chapter 02 — loss scaling and FP32 master weights: the helpers the
// chapter's pitfalls share (declared and described in common.hpp).
// Depends on: common.hpp, ../training.hpp (batch_loss, mlp_config, blobs()),
// mpt/nn/layers/losses.hpp (accuracy); <cmath>, <cstdio>, <string>, <utility>.
#include "common.hpp"

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "../training.hpp"
#include "mpt/nn/layers/losses.hpp"

namespace mpt::ch02 {

std::string num(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
std::string pct(double fraction) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fraction);
  return buf;
}

double set_loss(Mlp& net, const Dataset& d) { return batch_loss(net.forward(d.x), d); }
double set_accuracy(Mlp& net, const Dataset& d) { return accuracy(net.forward(d.x), d.labels); }

double nonfinite_weights(Mlp& net) {
  double n = 0;
  for (const Parameter* p : net.parameters())
    n += static_cast<double>((!p->master.f32().array().isFinite()).count());
  return n;
}

Check check(std::string claim, std::function<bool(const RunResult&)> holds) {
  return Check{std::move(claim), std::move(holds)};
}
bool within(double x, double target, double rel) { return std::fabs(x - target) <= rel * std::fabs(target); }

}  // namespace mpt::ch02
