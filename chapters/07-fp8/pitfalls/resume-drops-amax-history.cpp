// Chapter 07 — pitfall resume-drops-amax-history: a resume without the FP8 scaling state
// Depends on: common.hpp (check, num, this entry's declaration),
// mpt/fp8/quantize.hpp (fp8_spec: E5M2's smallest subnormal),
// mpt/train/run.hpp (TrainRun: `mpt train`'s run), mpt/train/checkpoint.hpp
// (serialize_checkpoint, parse_checkpoint); <algorithm>, <cmath>, <cstdint>,
// <cstring>, <map>, <stdexcept>, <string>, <vector>.
//
// Under delayed scaling, each FP8 tensor's scale comes from the amaxes of
// earlier steps (scale = fp8_max / max(amax history)): the histories and
// scales are state, as much as the weights and the optimizer's moments. A
// resume that restores the masters and the optimizer but not them starts
// every tensor at scale 1 with an empty history — a fresh run's FP8 state in
// the middle of training. (Transformer Engine keeps them in each module's
// `_extra_state` entry of the state dict: NVIDIA/TransformerEngine
// docs/faq.rst, "FP8 checkpoint compatibility"; a loader that leaves that
// entry behind resumes so.) The first step after
// it quantizes with scale 1: the output gradients, whose amax lies many
// binades below E5M2's max, keep only the few binades between their amax
// and E5M2's smallest subnormal, and the forward tensors sit below E4M3's
// max instead of on it. Its update then takes the scales
// from the one amax the history has seen, not from the earlier steps' as
// the uninterrupted run does, and the two runs differ from there on.
// `mpt train`'s checkpoints hold every delayed state (fp8.amax_history/ and
// fp8.scale/ tensors); restoring them continues bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"
#include "mpt/fp8/quantize.hpp"
#include "mpt/train/checkpoint.hpp"
#include "mpt/train/run.hpp"

namespace mpt::ch07 {
namespace {
namespace resume_drops_amax_history {

constexpr std::int64_t kSaved = 100;  // steps before the checkpoint
constexpr std::int64_t kAfter = 20;   // steps after the resume, compared with the uninterrupted run

train::RunConfig config() {
  train::RunConfig c;
  c.model = "mlp";  // `mpt train --model mlp --policy fp8:delayed`: the blobs MLP, SGD
  c.policy = "fp8:delayed";
  c.scaler = "none";
  c.steps = kSaved + kAfter;
  return c;
}

bool is_fp8_state(const train::TensorRecord& t) { return t.name.rfind("fp8.", 0) == 0; }

const train::TensorRecord& record_named(const train::Checkpoint& c, const std::string& name) {
  for (const train::TensorRecord& t : c.tensors)
    if (t.name == name) return t;
  throw std::logic_error("resume-drops-amax-history: no tensor " + name + " in the checkpoint");
}

// Every delayed scale of a run, by name (fp8.scale/<layer>.<role>): the
// scales its next step quantizes with.
std::map<std::string, float> scales_of(const train::TrainRun& run) {
  std::map<std::string, float> s;
  for (const train::TensorRecord& t : run.checkpoint().tensors)
    if (t.name.rfind("fp8.scale/", 0) == 0) s[t.name.substr(10)] = t.values.at(0);
  return s;
}

// Every delayed state's last history entry, by name: after a step, the
// step's own amax (the update rolled it into the last slot).
std::map<std::string, float> amaxes_of(const train::TrainRun& run) {
  std::map<std::string, float> a;
  for (const train::TensorRecord& t : run.checkpoint().tensors)
    if (t.name.rfind("fp8.amax_history/", 0) == 0) a[t.name.substr(17)] = t.values.back();
  return a;
}

// A run's steps from the checkpoint on: the scales each step used, its
// amaxes, its loss.
struct Steps {
  std::vector<std::map<std::string, float>> scales;  // per step after the checkpoint
  std::vector<std::map<std::string, float>> amaxes;  // likewise
  std::vector<float> losses;                         // likewise
  std::uint64_t masters = 0;                         // the masters' checksum after the last
};

Steps continue_run(train::TrainRun& run) {
  Steps s;
  for (std::int64_t i = 0; i < kAfter; ++i) {
    s.scales.push_back(scales_of(run));
    s.losses.push_back(run.step().loss);
    s.amaxes.push_back(amaxes_of(run));
  }
  s.masters = run.masters_checksum();
  return s;
}

// The uninterrupted run, and the checkpoint it wrote after kSaved steps
// (the bytes of `mpt train --checkpoint`'s file): once per process.
struct Straight {
  std::string checkpoint;
  Steps steps;
};
const Straight& straight() {
  static const Straight s = [] {
    Straight r;
    train::TrainRun run(config());
    for (std::int64_t i = 0; i < kSaved; ++i) (void)run.step();
    r.checkpoint = train::serialize_checkpoint(run.checkpoint());
    r.steps = continue_run(run);
    return r;
  }();
  return s;
}

// 1 when a and b differ in any bit (a NaN payload or the sign of a zero included).
float bits_differ(float a, float b) {
  std::uint32_t ua = 0, ub = 0;
  std::memcpy(&ua, &a, sizeof a);
  std::memcpy(&ub, &b, sizeof b);
  return ua != ub ? 1.0f : 0.0f;
}

RunResult run(bool keep_fp8_state, std::string setup) {
  const train::Checkpoint saved = train::parse_checkpoint(straight().checkpoint);
  train::TrainRun resumed(config());
  if (!keep_fp8_state) {
    //! [resume-drops-amax-history-broken]
    // masters, optimizer, batch position restored; the FP8 states left as a
    // fresh run has them (scale 1, zero histories)
    train::Checkpoint partial = saved;
    const train::Checkpoint fresh = resumed.checkpoint();
    for (train::TensorRecord& t : partial.tensors)
      if (is_fp8_state(t)) t = record_named(fresh, t.name);
    resumed.restore(partial);
    //! [resume-drops-amax-history-broken]
  } else {
    //! [resume-drops-amax-history-fixed]
    // everything the checkpoint holds, fp8.amax_history/ and fp8.scale/ included
    resumed.restore(saved);
    //! [resume-drops-amax-history-fixed]
  }
  const double resumed_at = static_cast<double>(resumed.steps_done());
  double fp8_tensors = 0;
  for (const train::TensorRecord& t : saved.tensors) fp8_tensors += is_fp8_state(t) ? 1 : 0;
  const Steps mine = continue_run(resumed);
  const Steps& ref = straight().steps;
  // per step: the largest gap between a scale and the uninterrupted run's, in binades
  std::vector<double> gap(kAfter, 0.0);
  double steps_scales_differ = 0, steps_loss_differs = 0, worst_loss = 0, at_one = 0;
  for (std::size_t t = 0; t < static_cast<std::size_t>(kAfter); ++t) {
    bool differ = false;
    for (const auto& [name, s] : ref.scales[t]) {
      const float m = mine.scales[t].at(name);
      gap[t] = std::max(gap[t], std::fabs(std::log2(static_cast<double>(m) / s)));
      differ = differ || bits_differ(m, s) != 0;
      if (t == 0 && m == 1.0f) at_one += 1;
    }
    steps_scales_differ += differ ? 1 : 0;
    steps_loss_differs += bits_differ(mine.losses[t], ref.losses[t]);
    worst_loss = std::max(worst_loss, std::fabs(static_cast<double>(mine.losses[t]) - ref.losses[t]) /
                                          static_cast<double>(ref.losses[t]));
  }
  // the first step's output gradients: how many binades below its amax each
  // kept (HYBRID: E5M2, down to its smallest subnormal)
  const FormatSpec& e5m2 = fp8::fp8_spec(DType::e5m2);
  const double bottom = e5m2.emin() - e5m2.mantissa_bits;
  double dy_kept = INFINITY;
  for (const auto& [name, s] : mine.scales[0])
    if (name.size() > 12 && name.compare(name.size() - 12, 12, ".grad_output") == 0)
      dy_kept = std::min(dy_kept, std::log2(static_cast<double>(mine.amaxes[0].at(name)) * s) - bottom);
  RunResult r;
  r.setup = std::move(setup);
  r.outcomes = {
      {"checkpoint_fp8_tensors", fp8_tensors, "fp8.amax_history/ and fp8.scale/ tensors in the checkpoint"},
      {"resumed_at_step", resumed_at, "the steps the resumed run had done when it continued"},
      {"fp8_scales", static_cast<double>(ref.scales[0].size()), "delayed scales (3 Linears × x, W, dy)"},
      {"first_step_scales_at_one", at_one, "scales of the first step after the resume that were 1"},
      {"first_step_scale_gap_binades", gap[0],
       "the first step: the largest |log2(scale / the uninterrupted run's)|"},
      {"first_step_dy_binades_kept", dy_kept,
       "the first step: the fewest binades an output gradient kept below its amax (log2(amax × scale / "
       "E5M2's smallest subnormal))"},
      {"last_step_scale_gap_binades", gap.back(),
       "step " + std::to_string(kAfter) + " after the resume: the same"},
      {"steps_scales_differ", steps_scales_differ,
       "of the " + std::to_string(kAfter) +
           " steps after the resume, those with a scale not the uninterrupted run's"},
      {"steps_loss_differs", steps_loss_differs,
       "those whose loss is not the uninterrupted run's, bit for bit"},
      {"largest_loss_difference", worst_loss, "the largest |loss − the uninterrupted run's| / its loss"},
      {"masters_equal", mine.masters == ref.masters ? 1.0 : 0.0,
       "1 if the masters after the last step equal the uninterrupted run's, bit for bit"},
  };
  std::string per_step;
  for (std::size_t t = 0; t < gap.size(); ++t) per_step += (t > 0 ? " " : "") + num(gap[t]);
  r.explanation = "The first step after the resume quantized with " + num(at_one) + " of " +
                  num(r.get("fp8_scales")) + " scales at 1, up to " + num(gap[0]) +
                  " binades from the uninterrupted run's; the output gradient with the fewest kept " +
                  num(dy_kept) + " binades of E5M2 below its largest value. " + num(steps_scales_differ) +
                  " of the " + std::to_string(kAfter) +
                  " steps used scales other than the uninterrupted run's, and " + num(steps_loss_differs) +
                  " had another loss (by up to " + num(100 * worst_loss) +
                  "%). The largest scale gap per step, in binades: " + per_step + ".";
  return r;
}

RunResult broken_run() {
  return run(false, "mpt train --model mlp --policy fp8:delayed, resumed after " + std::to_string(kSaved) +
                        " steps with the masters, SGD's momentum and the batch position, not the FP8 "
                        "histories and scales");
}
RunResult fixed_run() {
  return run(true,
             "the same resume from the whole checkpoint, the fp8.amax_history/ and fp8.scale/ "
             "tensors included");
}

}  // namespace resume_drops_amax_history
}  // namespace

Pitfall resume_drops_amax_history_pitfall() {
  using namespace resume_drops_amax_history;
  return Pitfall{
      "resume-drops-amax-history",
      7,
      "A resume that drops the amax histories: the steps after it quantize with other scales",
      "Delayed scaling's histories and scales are training state: a resume that restores the weights and "
      "the optimizer but not them starts every FP8 tensor at scale 1 with an empty history, so the first "
      "step quantizes with scale 1 and the later ones with scales from the few amaxes seen since. Restoring "
      "them (mpt train's checkpoints hold them) continues bit for bit.",
      broken_run,
      fixed_run,
      {
          check("the first step after the resume quantizes every tensor with scale 1",
                [](const RunResult& r) { return r.get("first_step_scales_at_one") == r.get("fp8_scales"); }),
          check("its scales are more than 8 binades from the uninterrupted run's",
                [](const RunResult& r) { return r.get("first_step_scale_gap_binades") > 8; }),
          check("an output gradient keeps fewer than 16 binades below its amax in that step",
                [](const RunResult& r) { return r.get("first_step_dy_binades_kept") < 16; }),
          check("every step after the resume has a loss of its own",
                [](const RunResult& r) { return r.get("steps_loss_differs") == kAfter; }),
          check("the masters end elsewhere", [](const RunResult& r) { return r.get("masters_equal") == 0; }),
      },
      {
          check("no scale of the first step is 1",
                [](const RunResult& r) { return r.get("first_step_scales_at_one") == 0; }),
          check("every output gradient keeps more than 24 binades below its amax in that step",
                [](const RunResult& r) { return r.get("first_step_dy_binades_kept") > 24; }),
          check("every scale of every step is the uninterrupted run's",
                [](const RunResult& r) { return r.get("steps_scales_differ") == 0; }),
          check("every loss is the uninterrupted run's, bit for bit",
                [](const RunResult& r) { return r.get("steps_loss_differs") == 0; }),
          check("the masters end equal, bit for bit",
                [](const RunResult& r) { return r.get("masters_equal") == 1; }),
      },
      {
          check(
              "the checkpoint holds a history and a scale per delayed scale",
              [](const RunResult& r) { return r.get("checkpoint_fp8_tensors") == 2 * r.get("fp8_scales"); }),
          check("both runs continue from the checkpoint's step",
                [](const RunResult& r) { return r.get("resumed_at_step") == kSaved; }),
      }};
}

}  // namespace mpt::ch07
