// Chapter 06 — per-task precision policies: what the pitfalls share, and their registry entries
// Depends on: ../../02-loss-scaling/pitfalls/common.hpp (check, num, pct),
// mpt/registry/pitfall.hpp.
//
// One file per pitfall, pitfalls/<id>.cpp: its broken run, its fixed run,
// their outcomes and its checks, ending with the function that returns its
// registry entry (declared here, called by pitfalls/register.cpp). Each
// decides with the library's own policies (the policy string, the autocast
// lists, the path rules) and measures with the precision trace and the cost
// model, on inputs small enough for `mpt tour` (milliseconds). The
// `//! [id-broken]` / `//! [id-fixed]` markers delimit the code the chapter
// text shows.
#pragma once

#include "../../02-loss-scaling/pitfalls/common.hpp"
#include "mpt/registry/pitfall.hpp"

namespace mpt::ch06 {

using ch02::check;
using ch02::num;
using ch02::pct;

/// Policy by name substring: "block1" in the name catches block10 and block11.
Pitfall name_substring_policy_pitfall();
/// binary_cross_entropy on fp16 probabilities (why autocast bans it).
Pitfall bce_on_fp16_probabilities_pitfall();
/// sum of an fp16 tensor where autocast is disabled, without an FP32 output dtype.
Pitfall sum_outside_autocast_pitfall();
/// model.half() under autocast: fp16 inputs to the fp32-list norms, γ and β cast at every call.
Pitfall half_under_autocast_pitfall();
/// The CPU autocast list is not the CUDA list.
Pitfall cpu_autocast_list_pitfall();
/// "Keep the Transformer's FFN in FP32", measured over paired seeds.
Pitfall ffn_fp32_rule_of_thumb_pitfall();
/// Everything in fp16 (apex O3): what fails first on each model.
Pitfall o3_everything_fp16_pitfall();

}  // namespace mpt::ch06
