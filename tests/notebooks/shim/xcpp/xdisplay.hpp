// All chapters — the notebooks: stand-in for xeus-cling's <xcpp/xdisplay.hpp>, on the
// include path of the project's own xcpp17 kernel only (xcpp17_kernel.py).
// Depends on: nlohmann/json (as the real header does), POSIX lseek.
//
// A notebook writes the same `#include "xcpp/xdisplay.hpp"` and
// `xcpp::display(obj)` it would in xeus-cling, where display() sends
// mime_bundle_repr(obj) to the front end as display_data at once (xeus-cling's
// include/xcpp/xdisplay.hpp and xmime.hpp), while what std::cout holds goes
// out only when it is flushed (xeus-cling's stream buffer sends on sync) or
// when the cell ends. Here nothing in the process speaks Jupyter, so display()
// leaves the bundle in a queue the kernel empties after each cell, stamped
// with how much of the cell's stdout had reached the capture file: text
// printed before the display but not flushed is not counted, so it comes out
// after the picture, as in xeus-cling. A notebook that wants its text first
// writes `std::cout << std::flush;` before display(), and a missing flush
// changes the order of the cell's outputs, which CI compares.
#ifndef XCPP_DISPLAY_HPP
#define XCPP_DISPLAY_HPP

#include <unistd.h>

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
  long stdout_offset;  // bytes of the cell's stdout flushed before this display
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
  // No flush here (xeus-cling's display() does none either): only what the
  // cell flushed has reached the file. The kernel gives C's stdout a buffer
  // larger than any cell's text, so unflushed text never spills early.
  const long offset = static_cast<long>(::lseek(STDOUT_FILENO, 0, SEEK_CUR));
  kernel_bridge::pending().push_back({offset, bundle.dump(-1, ' ', /*ensure_ascii=*/true)});
}

}  // namespace xcpp

#endif
