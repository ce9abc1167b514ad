// Chapters 04 onwards — fuzz target: the checkpoint loader
// (mpt::train::parse_checkpoint and parse_checkpoint_payload) and the checks
// a run makes before it continues from what was loaded (TrainRun::restore).
// Depends on: the mpt library's train tier (checkpoint.hpp, run.hpp),
// fuzz_check.hpp.
//
// The input is read twice: as a whole file (header, payload, checksum; a
// random input rarely gets past the checksum) and as a payload alone (what
// the file parser reads once the checksum matched). Properties:
//  - refused: std::invalid_argument and nothing else, with one line;
//  - accepted: the checkpoint serializes back to exactly the input (the
//    format has one spelling of each checkpoint), and a run of the model it
//    names either continues from it or refuses it with one line, leaving the
//    run as it was. Only the MLP on synthetic data is built (cheap, no data
//    file); other models' checkpoints are checked by the format alone.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "mpt/train/checkpoint.hpp"
#include "mpt/train/run.hpp"

namespace {

using mpt::fuzz::fuzz_require;
using mpt::train::Checkpoint;

// The 28 bytes of the file around a payload: magic, version, length; checksum.
std::string payload_of(const std::string& file) { return file.substr(20, file.size() - 28); }

void check_restore(const Checkpoint& c) {
  if (c.config.model != "mlp" || c.config.data != "synthetic") return;
  mpt::train::RunConfig config;
  try {
    config = mpt::train::resolve_config(c.config);
  } catch (const std::invalid_argument& e) {
    fuzz_require(mpt::fuzz::is_one_line(e.what()), std::string("resolve_config: not one line: ") + e.what());
    return;
  }
  if (config.steps > 1000 || c.step > 1000) return;  // a run's own size, not the loader's
  mpt::train::TrainRun run(config);
  const std::uint64_t before = run.masters_checksum();
  try {
    run.restore(c);
  } catch (const std::invalid_argument& e) {
    fuzz_require(mpt::fuzz::is_one_line(e.what()), std::string("restore: not one line: ") + e.what());
    fuzz_require(run.masters_checksum() == before && run.steps_done() == 0,
                 "a refused restore changed the run");
    return;
  }
  fuzz_require(run.steps_done() == c.step, "restore did not take the checkpoint's step");
}

void check(const std::string& bytes, bool whole_file) {
  Checkpoint c;
  try {
    c = whole_file ? mpt::train::parse_checkpoint(bytes) : mpt::train::parse_checkpoint_payload(bytes);
  } catch (const std::invalid_argument& e) {
    fuzz_require(mpt::fuzz::is_one_line(e.what()), std::string("refusal is not one line: ") + e.what());
    return;
  }
  const std::string again = mpt::train::serialize_checkpoint(c);
  fuzz_require((whole_file ? again : payload_of(again)) == bytes,
               "an accepted checkpoint does not serialize back to its bytes");
  check_restore(c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes = mpt::fuzz::input_text(data, size);
  check(bytes, true);
  check(bytes, false);
  return 0;
}
