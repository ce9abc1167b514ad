// Chapters 04 onwards — the chapters' models by name (see model_factory.hpp).
// Depends on: model_factory.hpp, mlp.hpp, cnn.hpp, transformer.hpp.
#include "mpt/nn/models/model_factory.hpp"

#include <stdexcept>

#include "mpt/nn/models/cnn.hpp"
#include "mpt/nn/models/mlp.hpp"
#include "mpt/nn/models/transformer.hpp"

namespace mpt {

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"mlp", "cnn", "transformer"};
  return names;
}

std::unique_ptr<Model> make_model(const ModelSpec& spec) {
  if (spec.name == "mlp") {
    MlpConfig c;
    c.sizes = spec.mlp_sizes;
    c.activation = spec.mlp_activation;
    c.dtype = spec.dtype;
    c.policy = spec.policy;
    c.seed = spec.seed;
    return std::make_unique<Mlp>(c);
  }
  if (spec.name == "cnn") {
    CnnConfig c;
    c.dtype = spec.dtype;
    c.policy = spec.policy;
    c.seed = spec.seed;
    return std::make_unique<Cnn>(c);
  }
  if (spec.name == "transformer") {
    TransformerConfig c;
    if (spec.vocab_size != 0) c.vocab_size = spec.vocab_size;
    c.dtype = spec.dtype;
    c.policy = spec.policy;
    c.seed = spec.seed;
    return std::make_unique<TinyTransformer>(c);
  }
  std::string valid;
  for (const std::string& n : model_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw std::invalid_argument("make_model: unknown model '" + spec.name + "'; valid: " + valid);
}

}  // namespace mpt
