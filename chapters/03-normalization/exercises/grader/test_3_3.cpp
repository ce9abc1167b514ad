// Chapter 03 — exercises: grader tests for exercise 3.3 (diagnose: a BatchNorm's running estimates).
// Depends on: grader.hpp (the reference: mpt's BatchNorm with FP32
// parameters and buffers on the same activations, batch after batch).
// Four test cases, three points each (a diagnose exercise's): one batch
// from fresh estimates, features near 1000 over 100 batches, a feature whose
// variance is above fp16's largest value, features of small variance. The
// given, broken body (the running estimates rounded into the activations'
// format) fails every one of them; its outputs y are right throughout.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "grader.hpp"

namespace {

using namespace mpt::ex03;
using namespace mpt::ex03::grading;

// "[16, 4]".
std::string bracketed(const mpt::Shape& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

// Which running estimates a test case grades (its title names them).
enum class Graded { none, both, mean, var };

// What is wrong with the graded running estimates ("" when nothing).
// `sigma`: the features' standard deviations (the running mean's scale).
std::string running_problem(const BatchNormPair& p, const std::vector<double>& sigma, Graded graded) {
  std::string problem;
  if (graded == Graded::both || graded == Graded::mean)
    problem = running_difference("running_mean", p.student.mean, p.reference_mean(), sigma);
  if (problem.empty() && (graded == Graded::both || graded == Graded::var))
    problem = running_difference("running_var", p.student.var, p.reference_var(), {});
  return problem;
}

// One training forward of both; "" when the student's y, count and graded
// running estimates match the reference's, else what differs first.
std::string compare_step(BatchNormPair& p, const mpt::Tensor& x, const std::vector<double>& sigma,
                         Graded graded) {
  const std::vector<float> want_y = p.reference_step(x);
  mpt::Tensor y;
  const std::vector<float> got_y = p.student_step(x, y);
  if (y.dtype() != x.dtype() || y.shape() != x.shape())
    return "y is " + std::string(mpt::dtype_name(y.dtype())) + " " + bracketed(y.shape()) + ", expected " +
           std::string(mpt::dtype_name(x.dtype())) + " " + bracketed(x.shape());
  const double off = worst_output_error(got_y, want_y, p, x);
  if (!(off <= 1.0))
    return "y is off by " + short_number(off) + " times what rounding allows (one unit of " +
           std::string(mpt::dtype_name(x.dtype())) + "'s spacing plus 64 epsilons of the terms)";
  if (p.student.num_batches_tracked != p.reference.num_batches_tracked)
    return "num_batches_tracked is " + std::to_string(p.student.num_batches_tracked) + ", expected " +
           std::to_string(p.reference.num_batches_tracked);
  const std::string problem = running_problem(p, sigma, graded);
  return problem.empty() ? "" : "y is right, but " + problem;
}

// Runs `batches` training forwards on fresh seeded activations, y and the
// count checked after every batch, the graded running estimates after the
// last (each side carries its own: where they end up is the symptom). Adds
// one line on the first difference; returns whether everything matched.
bool run_batches(Mismatches& m, BatchNormPair& p, int batches, std::uint32_t seed, const mpt::Shape& shape,
                 mpt::DType dtype, const std::vector<double>& means, const std::vector<double>& stds,
                 const std::string& what, Graded graded) {
  m.checked();
  for (int b = 1; b <= batches; ++b) {
    const mpt::Tensor x = activations(seed + static_cast<std::uint32_t>(b), shape, dtype, means, stds);
    const std::string problem = compare_step(p, x, stds, Graded::none);
    if (problem.empty()) continue;
    if (m.wrong())
      m.detail(what + ", after batch " + std::to_string(b) + " of " + std::to_string(batches) + ": " +
               problem);
    return false;
  }
  const std::string problem = running_problem(p, stds, graded);
  if (problem.empty()) return true;
  if (m.wrong())
    m.detail(what + ", after " + std::to_string(batches) + (batches == 1 ? " batch" : " batches") +
             ": y is right, but " + problem);
  return false;
}

}  // namespace

TEST_SUITE("exercise-3.3") {
  TEST_CASE("3.3 one batch from fresh estimates: y, the running update and the count, as mpt's BatchNorm") {
    Mismatches m;
    struct Case {
      mpt::DType dtype;
      mpt::Shape shape;
    };
    const Case cases[] = {{mpt::DType::f16, {16, 4}},      {mpt::DType::f16, {4, 4, 5, 5}},
                          {mpt::DType::bf16, {8, 4, 10}},  {mpt::DType::f16, {2, 4}},
                          {mpt::DType::f32, {6, 4, 3, 2}}, {mpt::DType::bf16, {3, 4, 1, 7}}};
    const std::vector<double> means{0.5, -3.0, 20.0, 0.01}, stds{1.0, 2.0, 0.5, 0.1};
    const std::vector<float> gamma{1.0f, 0.5f, -2.0f, 1.25f}, beta{0.0f, 0.1f, 1.0f, -0.3f};
    std::uint32_t seed = 600;
    for (const Case& c : cases) {
      BatchNormPair p(c.dtype, gamma, beta, {0.0f, 0.0f, 0.0f, 0.0f}, {1.0f, 1.0f, 1.0f, 1.0f}, 1e-5f, 0.1f);
      run_batches(m, p, 1, seed += 10, c.shape, c.dtype, means, stds,
                  std::string(mpt::dtype_name(c.dtype)) + " activations " + bracketed(c.shape) +
                      ", running estimates from (0, 1), momentum 0.1",
                  Graded::both);
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "3.3 features near 1000 (std 1): after 100 batches the running mean has reached the data's mean") {
    // Unnormalized input features (a pixel value, a price, a count) sit far
    // from 0; with momentum 0.1 the running mean closes 10% of the gap every
    // batch, nudges of 0.25 and less in the last stretch.
    Mismatches m;
    const std::vector<double> means{1000.0, 700.0, 1500.0, 300.0}, stds{1.0, 1.0, 2.0, 0.5};
    BatchNormPair p(mpt::DType::f16, {1.0f, 1.0f, 1.0f, 1.0f}, {0.0f, 0.0f, 0.0f, 0.0f},
                    {0.0f, 0.0f, 0.0f, 0.0f}, {1.0f, 1.0f, 1.0f, 1.0f}, 1e-5f, 0.1f);
    const bool ok = run_batches(
        m, p, 100, 700u, {32, 4}, mpt::DType::f16, means, stds,
        "f16 activations [32, 4], features near 1000, 700, 1500 and 300, momentum 0.1", Graded::mean);
    if (!ok) {
      // What eval mode makes of the estimates the student's body kept.
      std::string shifts;
      const std::vector<float> want = p.reference_mean();
      for (std::size_t c = 0; c < want.size(); ++c)
        shifts += (c ? ", " : "") + short_number((p.student.mean[c] - want[c]) / stds[c]);
      m.detail("in eval mode, normalizing with those running means would shift the four features by " +
               shifts + " standard deviations");
    }
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "3.3 a feature of standard deviation 300: its running variance, 9e4, is above fp16's largest value") {
    Mismatches m;
    const std::vector<double> means{0.0, 50.0, -20.0}, stds{300.0, 400.0, 1.0};
    BatchNormPair p(mpt::DType::f16, {1.0f, 1.0f, 1.0f}, {0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f},
                    {1.0f, 1.0f, 1.0f}, 1e-5f, 0.1f);
    run_batches(m, p, 40, 800u, {64, 3, 2}, mpt::DType::f16, means, stds,
                "f16 activations [64, 3, 2], features of standard deviation 300, 400 and 1, momentum 0.1",
                Graded::var);
    CHECK_MESSAGE(m.none(), m.report());
  }

  TEST_CASE(
      "3.3 features of small variance (std 1e-3 and less): their running variances settle where the data's "
      "is") {
    Mismatches m;
    const std::vector<double> means{0.0, 0.25, -0.5}, stds{1e-3, 3e-4, 2e-3};
    BatchNormPair p(mpt::DType::f16, {1.0f, 1.0f, 1.0f}, {0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f},
                    {1.0f, 1.0f, 1.0f}, 1e-5f, 0.1f);
    run_batches(
        m, p, 250, 900u, {16, 3, 4}, mpt::DType::f16, means, stds,
        "f16 activations [16, 3, 4], features of standard deviation 1e-3, 3e-4 and 2e-3, momentum 0.1",
        Graded::var);
    CHECK_MESSAGE(m.none(), m.report());
  }

}  // TEST_SUITE
