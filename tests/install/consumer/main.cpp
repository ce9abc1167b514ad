// Chapter 01 — proof that an installed mpt is usable from outside the tree.
// Depends on: the installed package (mpt::mpt, mpt::chapters).
#include <cstdio>

#include <mpt/formats/format.hpp>
#include <mpt/formats/rounding.hpp>
#include <mpt/registry/pitfall.hpp>

int main() {
  const float y = mpt::round_value(65519.0f, mpt::format_named("fp16"));
  const std::size_t n = mpt::pitfall_registry().all().size();
  std::printf("fp16(65519) = %g; %zu pitfalls registered\n", static_cast<double>(y), n);
  return (y == 65504.0f && n > 0) ? 0 : 1;
}
