// All chapters — the command registry (see command.hpp).
// Depends on: command.hpp, CLI11.
#include "command.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mpt::cli {

namespace {

struct Family {
  OrderKey key;
  const char* name;
  AddCommands add;
};

// A function-local static: registrations run during static initialisation,
// in an order between files that C++ leaves open, so the list must exist
// before the first of them, whichever that is.
std::vector<Family>& families() {
  static std::vector<Family> list;
  return list;
}

int depth(const CLI::App* app) {
  int d = 0;
  for (; app->get_parent(); app = app->get_parent()) ++d;
  return d;
}

std::string path_of(const CLI::App* app) {
  std::string path;
  for (; app; app = app->get_parent()) path = app->get_name() + (path.empty() ? "" : " " + path);
  return path;
}

// Every subcommand without subcommands of its own, below `app`.
void leaves(const CLI::App* app, std::vector<const CLI::App*>& out) {
  const auto subs = app->get_subcommands([](const CLI::App*) { return true; });
  if (subs.empty() && app->get_parent()) out.push_back(app);
  for (const CLI::App* s : subs) leaves(s, out);
}

}  // namespace

void Handlers::on(const CLI::App* subcommand, Handler handler) {
  handlers_.emplace_back(subcommand, std::move(handler));
}

const Handler* Handlers::chosen() const {
  const Handler* best = nullptr;
  int best_depth = -1;
  for (const auto& [app, handler] : handlers_)
    if (app->parsed() && depth(app) > best_depth) {
      best = &handler;
      best_depth = depth(app);
    }
  return best;
}

bool Handlers::has(const CLI::App* subcommand) const {
  return std::any_of(handlers_.begin(), handlers_.end(),
                     [subcommand](const auto& h) { return h.first == subcommand; });
}

Registration::Registration(OrderKey key, const char* family, AddCommands add) {
  families().push_back({key, family, add});
}

void add_all_commands(CLI::App& app, Handlers& handlers) {
  std::vector<Family> list = families();
  auto rank = [](const Family& f) { return std::make_pair(f.key.chapter, f.key.position); };
  std::sort(list.begin(), list.end(),
            [&rank](const Family& a, const Family& b) { return rank(a) < rank(b); });
  for (std::size_t i = 1; i < list.size(); ++i)
    if (rank(list[i - 1]) == rank(list[i]))
      throw std::logic_error("command families '" + std::string(list[i - 1].name) + "' and '" + list[i].name +
                             "' share the order key {" + std::to_string(list[i].key.chapter) + ", " +
                             std::to_string(list[i].key.position) +
                             "}; give each family its own position in its chapter");
  for (const Family& f : list) f.add(app, handlers);
  std::vector<const CLI::App*> all;
  leaves(&app, all);
  for (const CLI::App* leaf : all)
    if (!handlers.has(leaf))
      throw std::logic_error("'" + path_of(leaf) +
                             "' has no handler; its family must call "
                             "handlers.on() for it");
}

}  // namespace mpt::cli
