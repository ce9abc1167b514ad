// Chapters 02 onwards — loss scaling and FP32 master weights: Module and
// Sequential (Chapter 3: train() / eval() reach every descendant).
// Depends on: module.hpp.
#include "mpt/nn/module.hpp"

#include <algorithm>
#include <stdexcept>

namespace mpt {

Tensor Module::forward(const Tensor& x, Context& ctx) {
  input_dtype_ = x.dtype();
  Tensor y = forward_impl(x, ctx);
  output_dtype_ = y.dtype();
  have_forward_ = true;
  return y;
}

Tensor Module::backward(const Tensor& dy, Context& ctx) {
  if (!have_forward_)
    throw std::logic_error(std::string(kind()) + (path_.empty() ? "" : " " + path_) +
                           "::backward: call forward() first");
  // Autograd gives a gradient its tensor's dtype: the output was stored in
  // output_dtype(), so its gradient is too.
  const Tensor g = ctx.cast(dy, output_dtype_, path_, Phase::backward, "dy");
  Tensor dx = backward_impl(g, ctx);
  if (!input_grad_ || dx.numel() == 0) return dx;
  // ... and the input's gradient leaves in the dtype the input arrived in
  // (the backward of the cast the op made at its boundary).
  return ctx.cast(dx, input_dtype_, path_, Phase::backward, "dx");
}

// --- Sequential ----------------------------------------------------------------

Module& Sequential::add(std::string name, std::unique_ptr<Module> child) {
  if (!child) throw std::invalid_argument("Sequential::add: no module for '" + name + "'");
  if (name.empty() || name.find('.') != std::string::npos)
    throw std::invalid_argument("Sequential::add: child name '" + name +
                                "' must be non-empty and contain no '.'");
  for (const auto& c : children_)
    if (c.first == name) throw std::invalid_argument("Sequential::add: a child named '" + name + "' exists");
  child->set_path(path().empty() ? name : path() + "." + name);
  children_.emplace_back(std::move(name), std::move(child));
  return *children_.back().second;
}

void Sequential::set_path(std::string p) {
  Module::set_path(std::move(p));
  for (auto& c : children_) c.second->set_path(path().empty() ? c.first : path() + "." + c.first);
}

Module* Sequential::find(std::string_view p) {
  if (p == path()) return this;
  for (auto& c : children_) {
    Module& m = *c.second;
    if (m.path() == p) return &m;
    if (auto* s = dynamic_cast<Sequential*>(&m))
      if (Module* found = s->find(p)) return found;
  }
  return nullptr;
}

std::vector<std::string> Sequential::paths() const {
  std::vector<std::string> out = inner_paths();  // a container's own parts first (a model's embedding_sum)
  for (const auto& c : children_) {
    out.push_back(c.second->path());
    if (const auto* s = dynamic_cast<const Sequential*>(c.second.get())) {
      const std::vector<std::string> inner = s->paths();  // its inner paths included
      out.insert(out.end(), inner.begin(), inner.end());
    } else {
      const std::vector<std::string> parts = c.second->inner_paths();
      out.insert(out.end(), parts.begin(), parts.end());
    }
  }
  return out;
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> out;
  for (auto& c : children_) {
    const std::vector<Parameter*> ps = c.second->parameters();
    out.insert(out.end(), ps.begin(), ps.end());
  }
  return out;
}

void Sequential::set_training(bool on) {
  Module::set_training(on);
  for (auto& c : children_) c.second->train(on);
}

void Sequential::apply_policy(const Policy& policy) {
  for (auto& c : children_) c.second->apply_policy(policy);
}

std::vector<const Tensor*> Sequential::saved() const {
  std::vector<const Tensor*> out;
  for (const auto& c : children_) {
    const std::vector<const Tensor*> s = c.second->saved();
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

std::size_t distinct_bytes(const std::vector<const Tensor*>& tensors) {
  std::vector<const void*> seen;
  std::size_t n = 0;
  for (const Tensor* t : tensors) {
    if (!t || t->numel() == 0) continue;
    if (std::find(seen.begin(), seen.end(), t->storage_id()) != seen.end()) continue;
    seen.push_back(t->storage_id());
    n += t->bytes();
  }
  return n;
}

std::size_t Sequential::saved_bytes() const { return distinct_bytes(saved()); }

Tensor Sequential::forward_impl(const Tensor& x, Context& ctx) {
  Tensor h = x;
  for (auto& c : children_) h = c.second->forward(h, ctx);
  return h;
}

Tensor Sequential::backward_impl(const Tensor& dy, Context& ctx) {
  gradients_.clear();
  Tensor g = dy;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    Module& m = *it->second;
    // The cast Module::backward would make, made here so that the kept
    // gradient is the one the child works with.
    g = ctx.cast(g, m.output_dtype(), m.path(), Phase::backward, "dy");
    if (keep_gradients_) gradients_.push_back(g);
    g = m.backward(g, ctx);
    if (g.numel() == 0) break;  // a child without input gradient: nothing flows further
  }
  return g;
}

void Sequential::visit(const std::function<void(Module&)>& f) {
  f(*this);
  for (auto& [name, child] : children_) child->visit(f);
}

}  // namespace mpt
