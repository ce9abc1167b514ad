// Chapters 02 onwards — loss scaling and FP32 master weights: the Module
// interface and the Sequential container (Chapter 3 adds train() / eval()).
// Depends on: the core tier (context.hpp, policy.hpp, tensor.hpp), parameter.hpp.
//
// Layers have forward and backward written out (no autograd, as in llm.c)
// behind one small interface. forward() keeps what backward() needs;
// backward() takes the gradient with respect to the last forward's output,
// adds every parameter's gradient into Parameter::grad and returns the
// gradient with respect to the input. Every op asks the Context's Policy
// for its precision; the Module base does what autograd does at the edges
// of an op: a gradient arriving in another dtype than its tensor's is cast
// to it, and the input gradient leaves in the dtype the input arrived in.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpt/core/context.hpp"
#include "mpt/core/policy.hpp"
#include "mpt/core/tensor.hpp"
#include "mpt/nn/parameter.hpp"

namespace mpt {

/// A layer (or a container of layers) with forward and backward.
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;             ///< optimizers hold pointers to the parameters
  Module& operator=(const Module&) = delete;  ///< optimizers hold pointers to the parameters
  /// Moving a layer moves its parameters (take parameters() after the move);
  /// a Sequential's children stay where they are.
  Module(Module&&) = default;
  /// See the move constructor.
  Module& operator=(Module&&) = default;

  /// "Linear", "ReLU", "Sequential", ...
  virtual const char* kind() const = 0;

  /// y = f(x), each op's precision from ctx's policy; keeps what backward needs.
  Tensor forward(const Tensor& x, Context& ctx);
  /// dx from dy (the gradient w.r.t. the last forward's output, cast to the
  /// output's dtype first); adds the parameters' gradients into their grad.
  /// dx comes back in the dtype forward's x arrived in; it is an empty
  /// tensor when input gradients are off (a network's first layer).
  /// Throws std::logic_error without a preceding forward().
  Tensor backward(const Tensor& dy, Context& ctx);

  /// Every parameter, own and children's, in order (stable pointers).
  virtual std::vector<Parameter*> parameters() { return {}; }
  /// Give each parameter the model-copy dtype `policy` says (the
  /// Policy::parameter_dtype of this layer's op at its path).
  virtual void apply_policy(const Policy& policy) { (void)policy; }
  /// Chapter 7: call f on this module, then on every module inside it (a
  /// Sequential's children, attention's projections), depth first, in order.
  virtual void visit(const std::function<void(Module&)>& f) { f(*this); }
  /// The tensors the last forward kept for backward.
  virtual std::vector<const Tensor*> saved() const { return {}; }
  /// Chapter 6: the paths of the parts this module runs that are not
  /// children of a Sequential — attention's projections ("<path>.q"), a
  /// block's residual additions ("<path>.residual1") — so that
  /// Sequential::paths() lists every path an op asks the policy with.
  virtual std::vector<std::string> inner_paths() const { return {}; }

  /// The layer's path in its model ("fc1"); a container sets its children's.
  const std::string& path() const { return path_; }
  /// Set the path (and, in containers, the children's and the parameter names).
  virtual void set_path(std::string path) { path_ = std::move(path); }
  /// Whether backward() computes dx (default true). Off for a first layer,
  /// whose input is data: one GEMM less, as in any framework.
  void set_input_grad(bool on) { input_grad_ = on; }
  /// See set_input_grad().
  bool input_grad() const { return input_grad_; }
  /// The dtype the last forward's output was stored in.
  DType output_dtype() const { return output_dtype_; }

  /// Training mode on (the default, as in PyTorch) or off, for this module
  /// and, in a container, every descendant: PyTorch's Module.train(mode).
  /// Only layers whose forward depends on it look at it (BatchNorm: batch
  /// statistics and running updates in training, running estimates in eval).
  void train(bool on = true) { set_training(on); }
  /// train(false): PyTorch's Module.eval().
  void eval() { train(false); }
  /// Whether the module is in training mode.
  bool training() const { return training_; }

 protected:
  /// What train() does: sets the flag; a container also passes it to its children.
  virtual void set_training(bool on) { training_ = on; }
  /// The layer's forward, after the base has noted x's dtype.
  virtual Tensor forward_impl(const Tensor& x, Context& ctx) = 0;
  /// The layer's backward: dy is already in output_dtype(); return dx in
  /// any dtype (the base casts it to the input's), or an empty tensor when
  /// !input_grad().
  virtual Tensor backward_impl(const Tensor& dy, Context& ctx) = 0;

 private:
  std::string path_;
  bool input_grad_ = true;
  bool training_ = true;
  bool have_forward_ = false;
  DType input_dtype_ = DType::f32, output_dtype_ = DType::f32;
};

/// Children run in order, each under its name: PyTorch's nn.Sequential with
/// named children (a child "fc1" of a model at path "" has path "fc1"; at
/// path "encoder" it has "encoder.fc1").
class Sequential : public Module {
 public:
  /// "Sequential".
  const char* kind() const override { return "Sequential"; }
  /// Append a child; throws std::invalid_argument for an empty or repeated
  /// name, or one containing '.'.
  Module& add(std::string name, std::unique_ptr<Module> child);
  /// Append a child constructed in place; returns it.
  template <class M, class... Args>
  M& emplace(const std::string& name, Args&&... args) {
    return static_cast<M&>(add(name, std::make_unique<M>(std::forward<Args>(args)...)));
  }
  /// Number of children.
  std::size_t size() const { return children_.size(); }
  /// Child i.
  Module& child(std::size_t i) { return *children_.at(i).second; }
  /// Child i.
  const Module& child(std::size_t i) const { return *children_.at(i).second; }
  /// The name of child i.
  const std::string& child_name(std::size_t i) const { return children_.at(i).first; }
  /// The module at `path` (this one or a descendant), or nullptr.
  Module* find(std::string_view path);
  /// The path of every descendant, in order (containers before their
  /// children), each followed by its inner_paths(): every path an op of the
  /// model asks the policy with (Chapter 6 checks patterns against it).
  std::vector<std::string> paths() const;

  std::vector<Parameter*> parameters() override;
  void apply_policy(const Policy& policy) override;
  /// This container, then each child's visit().
  void visit(const std::function<void(Module&)>& f) override;
  std::vector<const Tensor*> saved() const override;
  void set_path(std::string path) override;

  /// Keep, during backward, the gradient that reached each child's output
  /// (in its dtype), from the last child to the first: output_gradients().
  void keep_output_gradients(bool on) { keep_gradients_ = on; }
  /// The gradients kept by the last backward (see keep_output_gradients).
  const std::vector<Tensor>& output_gradients() const { return gradients_; }
  /// Bytes of the distinct buffers in saved(): a buffer two children keep
  /// (a ReLU's output is the next Linear's input) counts once.
  std::size_t saved_bytes() const;

 protected:
  Tensor forward_impl(const Tensor& x, Context& ctx) override;
  Tensor backward_impl(const Tensor& dy, Context& ctx) override;
  /// Sets its own flag and every child's (which pass it on to theirs).
  void set_training(bool on) override;

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  bool keep_gradients_ = false;
  std::vector<Tensor> gradients_;
};

/// Bytes of the distinct buffers among `tensors` (shared buffers count once).
std::size_t distinct_bytes(const std::vector<const Tensor*>& tensors);

}  // namespace mpt
