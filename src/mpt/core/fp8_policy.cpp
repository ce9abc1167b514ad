// Chapter 07 — FP8 training: the policy fp8:RECIPE and its named base.
// Depends on: fp8_policy.hpp, text.hpp (shown).
#include "mpt/core/fp8_policy.hpp"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "mpt/core/text.hpp"

namespace mpt {

namespace {
constexpr const char* kRecipes[] = {"delayed", "current", "mx-floor", "mx-rceil", nullptr};
constexpr const char* kPrefix = "fp8:";
}  // namespace

const char* const* fp8_recipe_names() { return kRecipes; }

std::string fp8_recipe_choices() { return "delayed, current, mx-floor, mx-rceil"; }

std::string Fp8Policy::describe() const {
  const std::string scales =
      recipe_ == "delayed"
          ? "scales per layer and tensor from the amax history of earlier steps (1024 steps, "
            "max, margin 0), updated after each step"
      : recipe_ == "current"
          ? "each tensor scaled by its own amax as it is quantized"
          : "one E8M0 scale per block of 32 along each GEMM's k (" +
                std::string(recipe_ == "mx-floor" ? "OCP's FLOOR" : "NVIDIA's RCEIL") + " rule)";
  const std::string formats = recipe_.rfind("mx-", 0) == 0
                                  ? "x, W and dy e4m3 (MXFP8), "
                                  : "x and W e4m3 forward, dy e5m2 backward (HYBRID), ";
  return "FP8, recipe " + recipe_ + ": Linear layers' GEMMs in FP8 — " + formats + scales +
         ", FP32 accumulation, bf16 out; every other op bf16, parameters FP32";
}

OpPrecision Fp8Policy::decide_op(const OpInfo& op, const OpQuery& q) const {
  if (op.kind == OpKind::loss)
    return {q.inputs.empty() ? DType::bf16 : q.inputs.front(), DType::f32, DType::f32};
  if (q.fp8_gemm && op.name == "linear") return {DType::e4m3, DType::f32, DType::bf16};
  return {DType::bf16, DType::f32, DType::bf16};
}

DType Fp8Policy::parameter_dtype_of(const OpInfo&, std::string_view) const { return DType::f32; }

std::optional<NamedBase> fp8_named_base(const std::string& text) {
  if (text.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string recipe = text.substr(4);
  bool known = false;
  for (const char* const* r = kRecipes; *r != nullptr; ++r) known = known || recipe == *r;
  if (!known)
    throw std::invalid_argument("named policy " + shown(text) + ": fp8 takes fp8:RECIPE with RECIPE one of " +
                                fp8_recipe_choices());
  NamedBase b{text, false, {}, {}};
  b.needs.scaler = "none";
  b.needs.origin = "Transformer Engine fp8_autocast with recipe " +
                   std::string(recipe == "delayed"   ? "DelayedScaling (Format.HYBRID)"
                               : recipe == "current" ? "Float8CurrentScaling (Format.HYBRID)"
                                                     : "MXFP8BlockScaling (Format.E4M3)") +
                   " inside bf16: Linear GEMMs in FP8, FP32 parameters, no loss scaler";
  b.make = [recipe](const NamedBase::Regions&) { return std::make_shared<Fp8Policy>(recipe); };
  return b;
}

std::string fp8_recipe_of_policy(const std::string& canonical_text) {
  if (canonical_text.rfind(kPrefix, 0) != 0) return "";
  const std::string base = canonical_text.substr(0, canonical_text.find('+'));
  return base.substr(4);
}

}  // namespace mpt
