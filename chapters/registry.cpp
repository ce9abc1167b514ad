// All chapters — the project's pitfall registry, filled chapter by chapter.
// Depends on: chapters.hpp (each chapter's registration function).
//
// A new chapter adds one call below; the order here is the order of
// `mpt pitfalls` and `mpt tour`.
#include "chapters.hpp"

namespace mpt {

const Registry& pitfall_registry() {
  // Built on first use (thread-safe since C++11), never at static
  // initialisation, so no chapter depends on another file's static order.
  static const Registry registry = [] {
    Registry r;
    register_chapter01_pitfalls(r);
    register_chapter02_pitfalls(r);
    register_chapter03_pitfalls(r);
    register_chapter04_pitfalls(r);
    register_chapter05_pitfalls(r);
    register_chapter06_pitfalls(r);
    register_chapter07_pitfalls(r);
    return r;
  }();
  return registry;
}

}  // namespace mpt
