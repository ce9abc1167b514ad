// All chapters — `mpt op`: the table of the ops the command line runs, one
// entry per op, and what an entry's runner is handed and hands back.
// Depends on: the mpt library's core tier (Tensor, DType, Policy); its .cpp
// also on cli_support.hpp (UsageError, number parsing) and the nn tier.
//
// An entry names its op (one of mpt::known_ops(), whose row also says which
// chapter runs it), its inputs and outputs for `mpt op list`, the options of
// its own beyond the common ones (--shape, --dtype, --policy, --train/--eval,
// --backward, --json), and a runner that builds the layer, runs forward (and
// backward) and returns the outputs by name. Making one more op runnable is
// one more entry in op_table() (op_runners.cpp); op_commands.cpp turns every
// entry into a subcommand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpt/core/dtype.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"

namespace mpt::cli::op {

/// The numbers on stdin, read (all of them, each parsed strictly) on the
/// first take() and handed out in blocks, one per tensor: the input, then
/// whatever else the op reads (a target), then, with --backward, the output
/// gradient. A block that does not fit, or numbers left over at finish(),
/// is a UsageError saying how many numbers were expected and how many came.
class StdinNumbers {
 public:
  /// Numbers from `in`; `backward` says that a block "dy" will follow the
  /// others (so that a short input can say so).
  StdinNumbers(std::istream& in, bool backward);
  /// One tensor's block: its name ("x", "target", "dy") and shape.
  struct Block {
    std::string name;  ///< as error lines name it
    Shape shape;       ///< numel(shape) numbers
  };
  /// The next blocks, one vector of numbers each, in order. Blocks that
  /// follow each other whatever the run does are taken in one call, so that
  /// a short stdin is told the whole count.
  std::vector<std::vector<float>> take(const std::vector<Block>& blocks);
  /// The next numel(shape) numbers, as the tensor `name`.
  std::vector<float> take(const std::string& name, const Shape& shape);
  /// UsageError unless every number was taken.
  void finish();

 private:
  void read_all();
  std::string expected() const;  // "18 numbers, 12 for x (3x4), then 6 for dy (3x2)"
  std::istream& in_;
  bool backward_, read_ = false, dy_taken_ = false;
  std::vector<float> values_;
  std::size_t used_ = 0;
  std::vector<std::string> blocks_;
};

/// The most elements a shape given to `mpt op` may have.
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 24;

/// "8x4x3x3" as a shape: sizes from 1, separated by x, at most kMaxElements
/// elements in all; a UsageError naming `flag` otherwise.
Shape parse_shape(const std::string& flag, const std::string& text);

/// One run of an op as the command line asked for it; every common option is
/// already checked.
struct OpCall {
  Shape shape;                           ///< --shape: the input's shape
  DType dtype;                           ///< --dtype: the input's dtype and the uniform policy's
  std::shared_ptr<const Policy> policy;  ///< --policy, over the uniform policy of dtype
  bool train = true;                     ///< --train (default) or --eval
  bool backward = false;                 ///< --backward
  /// The entry's own options by flag ("--out-features"): the text given, or
  /// the option's default; "" when neither.
  std::map<std::string, std::string> options;
};

/// One output of a run: its name ("y", "dx", "weight") and its tensor, in
/// the dtype it is stored in.
struct OpOutput {
  std::string name;  ///< printed as is
  Tensor value;      ///< the stored values
};

/// One option an entry takes beyond the common ones.
struct OpOption {
  std::string flag;           ///< "--out-features"
  std::string type_name;      ///< "N", in the help
  std::string help;           ///< one line for --help
  std::string default_value;  ///< "" when the option has none
};

/// What a runner gets: the call and the numbers on stdin (take the input's
/// block first, after checking the options; the caller calls finish()).
using OpRunner = std::vector<OpOutput> (*)(const OpCall& call, StdinNumbers& in);

/// One runnable op.
struct OpEntry {
  std::string name;     ///< one of mpt::known_ops(), e.g. "linear"
  std::string inputs;   ///< what it reads, shape rules included: "x [B, in]"
  std::string outputs;  ///< what it prints, in order: "y [B, out], weight, bias; --backward: dx, ..."
  std::string example;  ///< a command line that runs it, after `mpt op NAME`
  std::vector<OpOption> options;  ///< its own options
  bool has_modes;                 ///< whether --train and --eval change what it does
  OpRunner run;                   ///< builds the layer, runs it, returns the outputs
};

/// Every runnable op (`mpt op` lists them in the order of known_ops()).
const std::vector<OpEntry>& op_table();

}  // namespace mpt::cli::op
