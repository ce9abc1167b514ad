// Chapters 04 onwards — the kill test hook (see test_hooks.hpp).
// Depends on: test_hooks.hpp; <csignal>, <cstdlib>.
#include "mpt/train/test_hooks.hpp"

#include <csignal>
#include <cstdlib>
#include <stdexcept>

namespace mpt::train {

namespace {

constexpr const char* kForms =
    "step:N or checkpoint:N:PHASE with PHASE partial, before-fsync, before-rename or before-dir-fsync";

bool whole_number(const std::string& s, std::int64_t& out) {
  if (s.empty() || s.size() > 18) return false;
  out = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return out >= 1;
}

}  // namespace

KillPoint parse_kill_point(const std::string& text) {
  KillPoint k;
  if (text.empty()) return k;
  const auto refuse = [&text]() {
    throw std::invalid_argument(std::string(kKillAtVariable) + " '" + text + "' is not " + kForms +
                                " (N a step >= 1)");
  };
  if (text.rfind("step:", 0) == 0) {
    if (!whole_number(text.substr(5), k.step)) refuse();
    k.kind = KillPoint::Kind::step;
    return k;
  }
  if (text.rfind("checkpoint:", 0) != 0) refuse();
  const std::string rest = text.substr(11);
  const std::size_t colon = rest.find(':');
  if (colon == std::string::npos || !whole_number(rest.substr(0, colon), k.step)) refuse();
  const std::string phase = rest.substr(colon + 1);
  for (const AtomicWriteStage s : {AtomicWriteStage::partly_written, AtomicWriteStage::before_fsync,
                                   AtomicWriteStage::before_rename, AtomicWriteStage::before_dir_fsync})
    if (phase == atomic_write_stage_name(s)) {
      k.kind = KillPoint::Kind::checkpoint;
      k.stage = s;
      return k;
    }
  refuse();
  return k;
}

KillPoint kill_point_from_environment() {
  const char* v = std::getenv(kKillAtVariable);
  return parse_kill_point(v == nullptr ? "" : v);
}

void maybe_kill_after_step(const KillPoint& k, std::int64_t step) {
  if (k.kind == KillPoint::Kind::step && k.step == step) std::raise(SIGKILL);
}

void maybe_kill_in_checkpoint(const KillPoint& k, std::int64_t step, AtomicWriteStage s) {
  if (k.kind == KillPoint::Kind::checkpoint && k.step == step && k.stage == s) std::raise(SIGKILL);
}

}  // namespace mpt::train
