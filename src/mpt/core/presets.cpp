// Chapter 06 — per-task precision policies: the presets, and the named bases
// of the policy string (named_base, make_named_base).
// Depends on: presets.hpp, autocast.hpp, policy_string.hpp, text.hpp.
#include "mpt/core/presets.hpp"

#include <memory>
#include <stdexcept>
#include <utility>

#include "mpt/core/autocast.hpp"
#include "mpt/core/text.hpp"

namespace mpt {

const std::vector<ApexLevel>& apex_levels() {
  static const std::vector<ApexLevel> levels = {
      {"O0", "torch.float32", false, "None", "False", "1.0"},
      {"O1", "None", true, "None", "None", "dynamic"},
      {"O2", "torch.float16", false, "True", "True", "dynamic"},
      {"O3", "torch.float16", false, "False", "False", "1.0"},
  };
  return levels;
}

// --- jmp ----------------------------------------------------------------------------

namespace {

// jmp's parse_dtype: its dtype_to_names table, and "half" (f16 off TPU).
DType jmp_dtype(const std::string& all, const std::string& v) {
  if (v == "half" || v == "f16" || v == "float16") return DType::f16;
  if (v == "bf16" || v == "bfloat16") return DType::bf16;
  if (v == "full" || v == "f32" || v == "float32") return DType::f32;
  if (v == "f64" || v == "float64")
    throw std::invalid_argument(
        "jmp policy " + shown(all) + ": " + v +  // v is f64 or float64 here
        " is a dtype jmp accepts, but this library stores no f64 (f32, f16, bf16 only)");
  throw std::invalid_argument(
      "jmp policy " + shown(all) + ": unknown dtype " + shown(v) +
      " (jmp: \"must be full,half,float16,bfloat16 or a contraction thereof\"; its names "
      "are full, f32, float32, half, f16, float16, bf16, bfloat16)");
}

// jmp's dtype_to_names puts "full" first for float32, so its str() says "full".
const char* jmp_name(DType d) { return d == DType::f32 ? "full" : d == DType::f16 ? "f16" : "bf16"; }

}  // namespace

std::string JmpSpec::jmp_text() const {
  return std::string("p=") + jmp_name(params) + ",c=" + jmp_name(compute) + ",o=" + jmp_name(output);
}

std::string JmpSpec::text() const {
  return "p=" + std::string(dtype_name(params)) + ",c=" + std::string(dtype_name(compute)) +
         ",o=" + std::string(dtype_name(output));
}

JmpSpec parse_jmp(const std::string& text) {
  JmpSpec s;
  if (text.find('=') == std::string::npos) {
    // "Assume policy name is a dtype": all three in it.
    s.params = s.compute = s.output = jmp_dtype(text, text);
    return s;
  }
  std::optional<DType> compute, output;
  for (const std::string& part : split_at(text, ',')) {
    // jmp: key, value = part.split("=", 2) — exactly one '=' unpacks.
    const std::vector<std::string> kv = split_at(part, '=');
    if (kv.size() != 2)
      throw std::invalid_argument("jmp policy " + shown(text) + ": " + shown(part) +
                                  " is not KEY=DTYPE (jmp unpacks each comma-separated part into a key and a "
                                  "value)");
    const DType value = jmp_dtype(text, kv[1]);  // jmp parses the value before it looks at the key
    if (kv[0] == "p" || kv[0] == "params") s.params = value;
    else if (kv[0] == "c" || kv[0] == "compute") compute = value;
    else if (kv[0] == "o" || kv[0] == "output") output = value;
    else
      throw std::invalid_argument("jmp policy " + shown(text) + ": unknown key " + shown(kv[0]) +
                                  " (jmp: \"should be 'params', 'compute' or 'output'\", or p, c, o)");
  }
  s.compute = compute.value_or(s.params);  // compute follows params ...
  s.output = output.value_or(s.compute);   // ... and output follows compute
  return s;
}

// --- CastAllPolicy ------------------------------------------------------------------

CastAllPolicy::CastAllPolicy(std::string name, DType params, DType compute, std::optional<DType> output)
    : name_(std::move(name)), params_(params), compute_(compute), output_(output) {}

OpPrecision CastAllPolicy::decide_op(const OpInfo& op, const OpQuery& q) const {
  if (op.kind == OpKind::loss)
    return {q.inputs.empty() ? compute_ : q.inputs.front(), DType::f32, DType::f32};
  return {compute_, DType::f32, compute_};
}

DType CastAllPolicy::parameter_dtype_of(const OpInfo&, std::string_view) const { return params_; }

// --- the named bases of the policy string ----------------------------------------------

namespace {

constexpr const char* kAutocast = "autocast:";
constexpr const char* kJmp = "jmp:";

bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string apex_origin(const ApexLevel& l) {
  return "apex opt_level " + l.name + ": cast_model_type=" + l.cast_model_type +
         ", patch_torch_functions=" + (l.patch_torch_functions ? "True" : "False") +
         ", keep_batchnorm_fp32=" + l.keep_batchnorm_fp32 + ", master_weights=" + l.master_weights +
         ", loss_scale=" + l.loss_scale;
}

}  // namespace

std::string named_base_choices() {
  return "O0-O3, mixed_float16, mixed_bfloat16, autocast:cuda|cpu[:f16|bf16], jmp:POLICY, "
         "fp8:delayed|current|mx-floor|mx-rceil";
}

namespace {

std::vector<AutocastRegion> regions_of(const NamedBase::Regions& regions) {
  std::vector<AutocastRegion> rs;
  for (const auto& [pattern, on] : regions) rs.push_back({pattern, on});
  return rs;
}

// A base that is no autocast policy: the parser gives it no regions.
template <class F>
NamedBase::Make without_regions(F build) {
  return [build](const NamedBase::Regions&) { return build(); };
}

}  // namespace

std::optional<NamedBase> named_base(const std::string& text) {
  if (std::optional<NamedBase> fp8 = fp8_named_base(text)) return fp8;  // Chapter 7
  for (const ApexLevel& l : apex_levels()) {
    if (text != l.name) continue;
    NamedBase b{l.name, l.patch_torch_functions, {}, {}};
    b.needs.master_weights = l.master_weights != "False";
    b.needs.scaler = l.loss_scale == "dynamic" ? "dynamic" : "static:1";
    b.needs.origin = apex_origin(l);
    if (l.name == "O1") {  // patch_torch_functions: autocast's lists
      b.make = [](const NamedBase::Regions& r) {
        return std::make_shared<AutocastPolicy>(AutocastDevice::cuda, DType::f16, regions_of(r));
      };
    } else if (l.name == "O2") {  // cast_model_type float16, keep_batchnorm_fp32 (parameters only)
      b.make = without_regions([] {
        return std::make_shared<FloatParamsPolicy>(uniform_policy(DType::f16),
                                                   std::vector<std::string>{"batch_norm"});
      });
    } else {  // O0: float32 throughout; O3: float16 throughout
      const DType d = l.name == "O0" ? DType::f32 : DType::f16;
      b.make = without_regions([d] { return uniform_policy(d); });
    }
    return b;
  }
  if (text == "mixed_float16" || text == "mixed_bfloat16") {
    const bool f16 = text == "mixed_float16";
    const DType compute = f16 ? DType::f16 : DType::bf16;
    NamedBase b{text, false, {}, {}};
    b.needs.scaler = f16 ? "dynamic" : "";
    b.needs.origin = f16 ? "Keras mixed_float16: variables float32, compute float16; Model.compile adds a "
                           "LossScaleOptimizer (dynamic loss scaling)"
                         : "Keras mixed_bfloat16: variables float32, compute bfloat16; no loss scaling";
    b.make = without_regions(
        [text, compute] { return std::make_shared<CastAllPolicy>(text, DType::f32, compute, std::nullopt); });
    return b;
  }
  if (starts(text, kAutocast)) {
    const std::vector<std::string> p = split_at(text.substr(9), ':');
    if (p.size() > 2 || (p[0] != "cuda" && p[0] != "cpu"))
      throw std::invalid_argument("named policy " + shown(text) +
                                  ": autocast takes autocast:DEVICE[:DTYPE] with DEVICE "
                                  "cuda or cpu and DTYPE f16 or bf16");
    const AutocastDevice dev = p[0] == "cuda" ? AutocastDevice::cuda : AutocastDevice::cpu;
    DType d = autocast_default_dtype(dev);
    if (p.size() == 2) {
      try {
        d = dtype_named(p[1]);
      } catch (const std::invalid_argument&) {
        d = DType::f32;  // refused just below, with the valid choices
      }
      if (d != DType::f16 && d != DType::bf16)
        throw std::invalid_argument("named policy " + shown(text) +
                                    ": autocast's DTYPE is f16 or bf16, not " + shown(p[1]));
    }
    return NamedBase{"autocast:" + p[0] + ":" + std::string(dtype_name(d)),
                     true,
                     {true, "",
                      "torch.autocast(\"" + p[0] + "\", dtype=" + std::string(dtype_name(d)) +
                          "): PyTorch's " + p[0] + " op lists; no scaler of its own"},
                     [dev, d](const NamedBase::Regions& r) {
                       return std::make_shared<AutocastPolicy>(dev, d, regions_of(r));
                     }};
  }
  if (starts(text, kJmp)) {
    const JmpSpec j = parse_jmp(text.substr(4));
    return NamedBase{
        "jmp:" + j.text(),
        false,
        {j.params == DType::f32, "",
         "jmp policy " + j.jmp_text() + " (params, compute, output); jmp's loss scales are separate"},
        without_regions([j] {
          return std::make_shared<CastAllPolicy>("jmp " + j.text(), j.params, j.compute, j.output);
        })};
  }
  return std::nullopt;
}

}  // namespace mpt
