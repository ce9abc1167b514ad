// Chapter 02 — loss scaling and FP32 master weights: the GradScaler's GPU
// kernels (kernels/amp/scaler.cu) against the CPU reference.
// Depends on: mpt (unscale.hpp, scaler_math.hpp: the reference), mpt::kernels,
// tests/cuda_host/sweep_values.hpp (adversarial inputs),
// tests/cuda_host/scale_update_cases.hpp (the scale-update sequences),
// gpu_test_support.hpp.
// Without a usable GPU it prints why and exits 77 (CTest: Skipped).
//
// Tolerance: none. The unscale is one fp32 multiply per element on both
// sides (no FTZ on either) and the update rule is the same function, so the
// bits must match exactly, for power-of-two and other inverse scales alike.
// One allowance, stated: a GPU multiply returns the canonical NaN while x86
// keeps the input's payload, so where the reference is NaN the GPU value
// must be NaN (any payload). With inv_scale == 1 nothing is multiplied and
// even NaN payloads must match.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"
#include "kernels/amp/amp_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "mpt/amp/scaler_math.hpp"
#include "mpt/amp/unscale.hpp"
#include "scale_update_cases.hpp"
#include "sweep_values.hpp"

namespace {

using mpt::cuda::KernelVersion;
using mpt::test::bits_from_float;
using mpt::test::DeviceArray;
using mpt::test::float_from_bits;
using mpt::test::version_name;

const float kInf = std::numeric_limits<float>::infinity();
const std::uint32_t kPoison = 0xffffffffu;  // a NaN a GPU multiply would turn into 0x7fffffff

/// Compare floats bit for bit (NaN: any NaN when nan_any_payload); print the
/// first mismatches and the count, llm.c style.
std::size_t mismatches(const std::vector<float>& want, const std::vector<float>& got, bool nan_any_payload,
                       const std::string& what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (mpt::test::same_float(want[i], got[i], nan_any_payload)) continue;
    if (bad++ < 5)
      std::printf("%s: [%zu] want %#010x (%a) got %#010x (%a)\n", what.c_str(), i, bits_from_float(want[i]),
                  want[i], bits_from_float(got[i]), got[i]);
  }
  if (bad)
    std::printf("%s: %zu of %zu differ (seed %llu)\n", what.c_str(), bad, want.size(),
                static_cast<unsigned long long>(mpt::test::test_seed()));
  return bad;
}

/// Tensors of mixed sizes carved from one flat buffer, with poisoned guard
/// floats between them. Starts alternate between 16-byte aligned and not, so
/// the vectorized kernel's float4 path and its scalar fallback both run.
/// Sizes straddle the 8192-element chunk and the 4-element vector.
struct Layout {
  std::vector<std::size_t> start, size;
  std::size_t total = 0;  // floats in the flat buffer, guards included
  Layout() {
    const std::size_t sizes[] = {1, 3, 4, 8191, 8192, 8193, 100003, 17, 0, 65536, 5, 24577};
    const std::size_t shift[] = {0, 1, 0, 2, 0, 3};
    std::size_t at = 4;  // a guard before the first tensor
    for (std::size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
      at = (at + 3) / 4 * 4 + shift[i % 6];
      start.push_back(at);
      size.push_back(sizes[i]);
      at += sizes[i] + 4;  // at least 4 guard floats after each tensor
    }
    total = at;
  }
  /// Device tensors of the flat device buffer d_flat.
  std::vector<mpt::cuda::DeviceTensor> device(float* d_flat) const {
    std::vector<mpt::cuda::DeviceTensor> v;
    for (std::size_t i = 0; i < start.size(); ++i) v.push_back({d_flat + start[i], size[i]});
    return v;
  }
  /// The same list over a host buffer, for the CPU reference.
  mpt::TensorList host(float* flat) const {
    mpt::TensorList v;
    for (std::size_t i = 0; i < start.size(); ++i) v.emplace_back(flat + start[i], size[i]);
    return v;
  }
  /// A flat host buffer: guards poisoned, tensor elements from `values`.
  std::vector<float> fill(const std::vector<float>& values) const {
    std::vector<float> flat(total, float_from_bits(kPoison));
    std::size_t k = 0;
    for (std::size_t i = 0; i < start.size(); ++i)
      for (std::size_t j = 0; j < size[i]; ++j) flat[start[i] + j] = values[k++ % values.size()];
    return flat;
  }
  /// True for the guard floats between tensors.
  std::vector<bool> guards() const {
    std::vector<bool> g(total, true);
    for (std::size_t i = 0; i < start.size(); ++i)
      for (std::size_t j = 0; j < size[i]; ++j) g[start[i] + j] = false;
    return g;
  }
  std::size_t elements() const {
    std::size_t n = 0;
    for (std::size_t s : size) n += s;
    return n;
  }
};

/// Finite, gradient-like values (normal, scaled over many binades).
std::vector<float> finite_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-40, 40);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(d(rng), e(rng));
  return v;
}

struct RunResult {
  std::vector<float> flat;
  float found = 0;
};

/// One GPU run: upload, reset the (poisoned) flag, unscale, download.
RunResult run_gpu(const Layout& L, const std::vector<float>& flat, float inv_scale, KernelVersion v) {
  DeviceArray<float> d_flat(flat);
  DeviceArray<float> d_inv(std::vector<float>{inv_scale});
  DeviceArray<float> d_found(1);
  d_found.poison();
  mpt::cuda::reset_found_inf(d_found.get());
  const mpt::cuda::DeviceTensorList list(L.device(d_flat.get()));
  mpt::cuda::unscale_and_check(list, d_inv.get(), d_found.get(), v);
  return {d_flat.download(), d_found.download()[0]};
}

void check_against_cpu(const Layout& L, const std::vector<float>& flat, float inv_scale, KernelVersion v,
                       const std::string& what) {
  std::vector<float> want = flat;
  const bool want_found = mpt::unscale_and_check(L.host(want.data()), inv_scale);
  const RunResult got = run_gpu(L, flat, inv_scale, v);
  const std::string name = what + " " + version_name(v) + " inv_scale " + std::to_string(inv_scale);
  CHECK_MESSAGE(got.found == (want_found ? 1.0f : 0.0f), name, ": found_inf ", got.found, " expected ",
                want_found);
  // Tensor elements: bit for bit (NaN: any NaN when a multiply happened).
  // Guards: exactly the poison, always — a kernel that strays outside a
  // tensor turns a guard's 0xffffffff into 0x7fffffff.
  std::size_t bad = mismatches(want, got.flat, inv_scale != 1.0f, name);
  const std::vector<bool> guard = L.guards();
  for (std::size_t i = 0; i < flat.size(); ++i)
    if (guard[i] && bits_from_float(got.flat[i]) != kPoison && bad++ < 5)
      std::printf("%s: guard at [%zu] was written\n", name.c_str(), i);
  CHECK_MESSAGE(bad == 0, name, ": ", bad, " mismatches");
}

}  // namespace

TEST_CASE("the tensor table: empty tensors dropped, chunks counted") {
  const Layout L;
  DeviceArray<float> d(L.total);
  const mpt::cuda::DeviceTensorList list(L.device(d.get()));
  CHECK(list.tensors() == L.size.size() - 1);  // one size is 0
  CHECK(list.elements() == L.elements());
  std::size_t chunks = 0;
  for (std::size_t s : L.size) chunks += (s + 8191) / 8192;
  CHECK(list.chunks() == chunks);
  const std::vector<mpt::cuda::DeviceTensor> null_tensor{{nullptr, 5}};
  CHECK_THROWS_AS(mpt::cuda::DeviceTensorList{null_tensor}, std::invalid_argument);
}

TEST_CASE("unscale_and_check: adversarial and random inputs, bit for bit against the CPU") {
  const Layout L;
  const std::uint64_t seed = mpt::test::test_seed();
  // Every class of float: hand-picked edges (inf, NaN with payloads, ±max,
  // fp32 subnormals, huge values), random bit patterns, values over each
  // narrow format's range.
  const std::vector<float> mixed = mpt::test::mixed_inputs(L.elements(), seed);
  const std::vector<float> finite = finite_values(L.elements(), seed + 1);
  const float inv_scales[] = {0x1p-16f, 1.0f / 3.0f, static_cast<float>(1.0 / (65536.0 * 3.0)),
                              1.0f,     0x1p+10f,    0.0f};
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized})
    for (float inv : inv_scales) {
      check_against_cpu(L, L.fill(mixed), inv, v, "mixed");
      check_against_cpu(L, L.fill(finite), inv, v, "finite");
    }
}

TEST_CASE("unscale_and_check: one inf or NaN anywhere sets found_inf; everything is unscaled") {
  const Layout L;
  const std::vector<float> finite = finite_values(L.elements(), 99);
  // First, last and chunk/vector-boundary elements of several tensors.
  std::vector<std::size_t> positions;
  for (std::size_t t = 0; t < L.size.size(); ++t) {
    if (L.size[t] == 0) continue;
    for (std::size_t j : {std::size_t{0}, L.size[t] - 1, L.size[t] / 2, std::size_t{8191}, std::size_t{8192},
                          std::size_t{4 * (L.size[t] / 4)}})
      if (j < L.size[t]) positions.push_back(L.start[t] + j);
  }
  const float bads[] = {kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), float_from_bits(0x7f800001u)};
  std::size_t k = 0;
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized})
    for (std::size_t pos : positions) {
      std::vector<float> flat = L.fill(finite);
      flat[pos] = bads[k++ % 4];
      check_against_cpu(L, flat, 0x1p-12f, v, "one bad at " + std::to_string(pos));
    }
}

TEST_CASE("unscale_and_check: found_inf is only ever set, never cleared; empty lists are no-ops") {
  const Layout L;
  const std::vector<float> flat = L.fill(finite_values(L.elements(), 5));
  for (KernelVersion v : {KernelVersion::simple, KernelVersion::vectorized}) {
    DeviceArray<float> d_flat(flat);
    DeviceArray<float> d_inv(std::vector<float>{0.5f});
    DeviceArray<float> d_found(std::vector<float>{1.0f});  // an earlier list overflowed
    const mpt::cuda::DeviceTensorList list(L.device(d_flat.get()));
    mpt::cuda::unscale_and_check(list, d_inv.get(), d_found.get(), v);
    CHECK(d_found.download()[0] == 1.0f);

    const std::vector<mpt::cuda::DeviceTensor> none, only_empty{{d_flat.get(), 0}, {nullptr, 0}};
    const mpt::cuda::DeviceTensorList empty(none), zeros(only_empty);
    DeviceArray<float> d_zero(std::vector<float>{0.0f});
    mpt::cuda::unscale_and_check(empty, d_inv.get(), d_zero.get(), v);
    mpt::cuda::unscale_and_check(zeros, d_inv.get(), d_zero.get(), v);
    CHECK(d_zero.download()[0] == 0.0f);
  }
  DeviceArray<float> d(1);
  const mpt::cuda::DeviceTensorList list(std::vector<mpt::cuda::DeviceTensor>{{d.get(), 1}});
  CHECK_THROWS_AS(mpt::cuda::unscale_and_check(list, d.get(), d.get(), static_cast<KernelVersion>(9)),
                  std::invalid_argument);
}

TEST_CASE("inverse_scale: (float)(1.0 / (double)scale), the bits the host computes") {
  const std::vector<float> scales = {65536.0f, 3.0f,   1.0f, 0.1f, 1e-30f,           0x1p-149f, 0x1p+127f,
                                     1.5f,     6.0e4f, 0.0f, kInf, 0x1.fffffep+127f, 7.0f};
  DeviceArray<float> d_scale(scales);
  DeviceArray<float> d_inv(scales.size());
  d_inv.poison();
  for (std::size_t i = 0; i < scales.size(); ++i)
    mpt::cuda::inverse_scale(d_scale.get() + i, d_inv.get() + i);
  std::vector<float> want;
  for (float s : scales) want.push_back(static_cast<float>(1.0 / static_cast<double>(s)));
  CHECK(mismatches(want, d_inv.download(), false, "inverse_scale") == 0);
}

TEST_CASE("update_scale on the device follows mpt::update_scale step for step") {
  // The cases and flag sequences of scale_update_cases.hpp. The reference
  // is mpt::update_scale with the double factors, which
  // tests/cpu/test_ch02_scaler_math.cpp shows is the CPU GradScaler's
  // sequence, and shows differs from the one float-rounded factors give for
  // the cases with 0.3 and 1.7: a float anywhere on the way to the device
  // fails this comparison.
  for (const mpt::test::ScaleUpdateCase& c : mpt::test::scale_update_cases()) {
    const std::vector<bool> found = mpt::test::scale_update_flags(c, mpt::test::test_seed());
    std::vector<float> flags;
    for (bool f : found) flags.push_back(f ? 1.0f : 0.0f);
    DeviceArray<float> d_flags(flags);
    DeviceArray<float> d_scale(std::vector<float>{c.init});
    DeviceArray<std::int32_t> d_tracker(std::vector<std::int32_t>{0});
    DeviceArray<float> d_hist(flags.size());
    DeviceArray<std::int32_t> d_thist(flags.size());
    d_hist.poison();
    d_thist.poison();
    // Every step queued back to back: no host synchronisation until the end.
    for (std::size_t s = 0; s < flags.size(); ++s) {
      mpt::cuda::update_scale(d_scale.get(), d_tracker.get(), d_flags.get() + s, c.growth, c.backoff,
                              c.interval);
      mpt::test::cuda_ok(cudaMemcpyAsync(d_hist.get() + s, d_scale.get(), 4, cudaMemcpyDeviceToDevice),
                         "record scale");
      mpt::test::cuda_ok(cudaMemcpyAsync(d_thist.get() + s, d_tracker.get(), 4, cudaMemcpyDeviceToDevice),
                         "record tracker");
    }
    const std::vector<float> hist = d_hist.download();
    const std::vector<std::int32_t> thist = d_thist.download();
    const std::vector<mpt::test::ScaleUpdateStep> ref =
        mpt::test::scale_update_sequence(c, found, c.growth, c.backoff);
    std::vector<float> want;
    std::size_t tracker_bad = 0;
    for (std::size_t s = 0; s < ref.size(); ++s) {
      want.push_back(ref[s].scale);
      if (thist[s] != ref[s].tracker && tracker_bad++ < 5)
        std::printf("update_scale %s: step %zu tracker %d expected %d\n", c.name, s + 1, thist[s],
                    ref[s].tracker);
    }
    CAPTURE(c.name);
    CHECK(mismatches(want, hist, false, std::string("update_scale ") + c.name) == 0);
    CHECK(tracker_bad == 0);
    if (c.init < 1.0f) CHECK(want[199] == 0.0f);  // driven to zero
    if (c.init >= 0x1p+126f)                      // grows up to 2^127, never to inf
      CHECK(*std::max_element(want.begin(), want.end()) == 0x1p+127f);
  }
}

TEST_CASE("a whole GradScaler step on the device, 30 steps, against the CPU") {
  // Per step: reset found_inf, inverse scale, fused unscale, scale update —
  // the sequence of amp_kernels.hpp's Chapter 2 comment — with overflow on
  // some steps. The CPU does the same with mpt::unscale_and_check and
  // mpt::update_scale; scale, tracker and gradients must agree exactly.
  // Factors 1.7 and 0.3 are not FP32 values: a float factor on the device
  // would differ from the third backoff on (inverse scales that are not
  // powers of two then test the unscale too).
  const double growth = 1.7, backoff = 0.3;
  const Layout L;
  std::mt19937_64 rng(mpt::test::test_seed() + 7);
  DeviceArray<float> d_flat(L.total);
  DeviceArray<float> d_scale(std::vector<float>{65536.0f});
  DeviceArray<float> d_inv(1);
  DeviceArray<float> d_found(1);
  DeviceArray<std::int32_t> d_tracker(std::vector<std::int32_t>{0});
  const mpt::cuda::DeviceTensorList list(L.device(d_flat.get()));
  float scale = 65536.0f;
  std::int32_t tracker = 0;
  for (int step = 0; step < 30; ++step) {
    std::vector<float> flat = L.fill(finite_values(L.elements(), rng()));
    if (step % 4 == 1) flat[L.start[6] + rng() % L.size[6]] = kInf;  // an overflow this step
    mpt::test::cuda_ok(cudaMemcpy(d_flat.get(), flat.data(), flat.size() * 4, cudaMemcpyHostToDevice),
                       "upload gradients");
    d_found.poison();
    mpt::cuda::reset_found_inf(d_found.get());
    mpt::cuda::inverse_scale(d_scale.get(), d_inv.get());
    mpt::cuda::unscale_and_check(list, d_inv.get(), d_found.get());
    mpt::cuda::update_scale(d_scale.get(), d_tracker.get(), d_found.get(), growth, backoff, 3);

    const float inv = static_cast<float>(1.0 / static_cast<double>(scale));
    const bool found = mpt::unscale_and_check(L.host(flat.data()), inv);
    mpt::update_scale(scale, tracker, found, growth, backoff, 3);

    CAPTURE(step);
    CHECK(d_found.download()[0] == (found ? 1.0f : 0.0f));
    CHECK(bits_from_float(d_scale.download()[0]) == bits_from_float(scale));
    CHECK(d_tracker.download()[0] == tracker);
    CHECK(mismatches(flat, d_flat.download(), true, "step " + std::to_string(step)) == 0);
  }
}

int main(int argc, char** argv) { return mpt::test::gpu_test_main(argc, argv); }
