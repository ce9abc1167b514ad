// All chapters — the notebooks: stand-in for xeus-cling's <xcpp/xdisplay.hpp>, on the
// include path of the project's own xcpp17 kernel only (xcpp17_kernel.py).
// Depends on: nlohmann/json (as the real header does), POSIX lseek.
//
// A notebook writes the same `#include "xcpp/xdisplay.hpp"` and
// `xcpp::display(obj)` it would in xeus-cling, where display() sends
// mime_bundle_repr(obj) to the front end as display_data (xeus-cling's
// include/xcpp/xdisplay.hpp and xmime.hpp). Here nothing in the process
// speaks Jupyter, so display() leaves the bundle in a queue the kernel empties
// after each cell, stamped with how far the cell's captured stdout had got,
// so text and pictures come out in the order the cell produced them.
#ifndef XCPP_DISPLAY_HPP
#define XCPP_DISPLAY_HPP

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nl = nlohmann;

namespace xcpp {

// The fallback xeus-cling uses when a type has no mime_bundle_repr of its
// own is cling::printValue, which this interpreter does not export; text
// via operator<< covers what the notebooks print.
template <class T>
nl::json mime_bundle_repr(const T& value) {
  std::ostringstream text;
  text << value;
  return nl::json{{"text/plain", text.str()}};
}

namespace kernel_bridge {

struct PendingDisplay {
  long stdout_offset;  // bytes of the cell's stdout written before this display
  std::string bundle;  // the mime bundle as ASCII JSON (the kernel decodes it)
};

inline std::vector<PendingDisplay>& pending() {
  static std::vector<PendingDisplay> queue;
  return queue;
}

}  // namespace kernel_bridge

template <class T>
void display(const T& t) {
  using ::xcpp::mime_bundle_repr;  // and, by argument-dependent lookup, the type's own
  const nl::json bundle = mime_bundle_repr(t);
  // Everything printed so far must reach the capture file before its length is read.
  std::cout.flush();
  std::fflush(stdout);
  const long offset = static_cast<long>(::lseek(STDOUT_FILENO, 0, SEEK_CUR));
  kernel_bridge::pending().push_back({offset, bundle.dump(-1, ' ', /*ensure_ascii=*/true)});
}

}  // namespace xcpp

#endif
