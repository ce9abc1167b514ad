// Docs — Chapter 01's bit-layout diagrams, drawn from the format descriptors.
// Depends on: mpt/format.hpp (all_formats, limits_of), mpt/explain.hpp (number
// spelling). Built as `mpt_diagrams`; the docs target runs it and Doxygen
// renders the .dot files it writes with Graphviz (\dotfile in the pages).
//
// Every field width in the pictures is read from mpt::FormatSpec, so a change
// to a descriptor changes the picture on the next docs build.
//
// usage: mpt_diagrams OUT_DIR
//   writes OUT_DIR/ch01_layouts.dot (all stock formats, one row each, drawn to
//   the same bit scale) and OUT_DIR/layout_NAME.dot (one format alone),
//   creating OUT_DIR if needed.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "mpt/formats/explain.hpp"
#include "mpt/formats/format.hpp"

namespace {

// Fill colours of the fields (the same in every diagram of the site).
constexpr const char* kSignColour = "#f2b8b5";
constexpr const char* kExponentColour = "#b7dfb0";
constexpr const char* kFractionColour = "#b3cdea";
constexpr const char* kUnusedColour = "#e4e4e4";

// One bit cell: a fixed-size box, so every format is drawn to the same scale.
constexpr int kBitWidth = 13;   // points
constexpr int kBitHeight = 18;  // points
std::string bit_cell(const char* colour, const char* letter) {
  return std::string("<TD BGCOLOR=\"") + colour + "\" WIDTH=\"" + std::to_string(kBitWidth) + "\" HEIGHT=\"" +
         std::to_string(kBitHeight) + "\" FIXEDSIZE=\"TRUE\">" + letter + "</TD>";
}

// What the all-ones exponent field means, in a few words.
std::string special_note(const mpt::FormatSpec& s) {
  return s.has_inf() ? "inf, NaN at all-ones exponent" : "no inf; NaN only at S.1111.111";
}

// The derived facts printed beside a format's bits (all computed, none typed),
// after the field widths `widths`.
std::string summary(const mpt::Format& f, const std::string& widths) {
  const mpt::FormatSpec& s = f.spec;
  const mpt::Limits l = mpt::limits_of(s);
  std::ostringstream out;
  out << widths << ", bias " << s.bias << "<BR ALIGN=\"LEFT\"/>"
      << "p = " << l.precision << ", max " << mpt::power_of_two_or_decimal(l.max) << ", eps "
      << mpt::power_of_two_or_decimal(l.epsilon) << "<BR ALIGN=\"LEFT\"/>" << l.storage_bytes
      << (l.storage_bytes == 1 ? " byte; " : " bytes; ") << special_note(s) << "<BR ALIGN=\"LEFT\"/>";
  return out.str();
}

// One table row for one format: its name, its bits (a nested table of
// fixed-size cells, so every format is drawn to the same scale), and the
// derived facts. `columns` is the widest format's storage size in bits: a
// blank filler after a narrower format keeps every row's sign bit at the same
// left edge.
std::string format_row(const mpt::Format& f, int columns) {
  const mpt::FormatSpec& s = f.spec;
  const int used = 1 + s.exponent_bits + s.mantissa_bits;
  const int unused = s.storage_bits > used ? s.storage_bits - used : 0;
  // FIXEDSIZE keeps the nested table from stretching to the widest row.
  std::string bits =
      "<TABLE BORDER=\"0\" CELLBORDER=\"1\" CELLSPACING=\"0\" CELLPADDING=\"0\""
      " FIXEDSIZE=\"TRUE\" WIDTH=\"" +
      std::to_string(kBitWidth * s.storage_bits) + "\" HEIGHT=\"" + std::to_string(kBitHeight) + "\"><TR>";
  bits += bit_cell(kSignColour, "S");
  for (int i = 0; i < s.exponent_bits; ++i) bits += bit_cell(kExponentColour, "E");
  for (int i = 0; i < s.mantissa_bits; ++i) bits += bit_cell(kFractionColour, "M");
  for (int i = 0; i < unused; ++i) bits += bit_cell(kUnusedColour, "");
  bits += "</TR></TABLE>";
  const int filler = columns - s.storage_bits;
  if (filler > 0) {
    bits = "<TABLE BORDER=\"0\" CELLBORDER=\"0\" CELLSPACING=\"0\" CELLPADDING=\"0\"><TR><TD>" + bits +
           "</TD><TD FIXEDSIZE=\"TRUE\" WIDTH=\"" + std::to_string(kBitWidth * filler) + "\" HEIGHT=\"" +
           std::to_string(kBitHeight) + "\"></TD></TR></TABLE>";
  }

  std::string widths =
      "1 + " + std::to_string(s.exponent_bits) + " + " + std::to_string(s.mantissa_bits) + " bits";
  if (unused > 0) widths += " + " + std::to_string(unused) + " unused";
  return "<TR><TD ALIGN=\"RIGHT\"><B>" + std::string(f.name) +
         "</B></TD>"
         "<TD ALIGN=\"LEFT\" BALIGN=\"LEFT\">" +
         bits +
         "</TD>"
         "<TD ALIGN=\"LEFT\"><FONT POINT-SIZE=\"9\">" +
         summary(f, widths) + "</FONT></TD></TR>\n";
}

// The key to the colours, as the graph's label above the table.
std::string legend() {
  std::string key = "<TABLE BORDER=\"0\" CELLBORDER=\"1\" CELLSPACING=\"4\" CELLPADDING=\"0\"><TR>";
  key += bit_cell(kSignColour, "S") + "<TD BORDER=\"0\">sign</TD>";
  key += bit_cell(kExponentColour, "E") + "<TD BORDER=\"0\">exponent</TD>";
  key += bit_cell(kFractionColour, "M") + "<TD BORDER=\"0\">fraction (mantissa)</TD>";
  key += bit_cell(kUnusedColour, "") + "<TD BORDER=\"0\">unused</TD>";
  key += "</TR></TABLE>";
  return key;
}

// A whole .dot document holding one table of the given formats.
template <typename Range>
std::string layout_graph(const std::string& graph_name, const Range& formats, bool with_legend) {
  std::string dot = "// Generated by mpt_diagrams (docs/diagrams.cpp) from mpt::all_formats().\n";
  dot += "digraph " + graph_name + " {\n";
  dot += "  graph [bgcolor=\"transparent\", fontname=\"Helvetica\", fontsize=11";
  if (with_legend) dot += ", labelloc=\"t\", labeljust=\"l\", label=<" + legend() + ">";
  dot += "];\n";
  dot += "  node [shape=plaintext, fontname=\"Helvetica\", fontsize=11];\n";
  dot += "  layout [label=<\n<TABLE BORDER=\"0\" CELLBORDER=\"0\" CELLSPACING=\"2\" CELLPADDING=\"3\">\n";
  int columns = 0;
  for (const mpt::Format& f : formats)
    columns = f.spec.storage_bits > columns ? f.spec.storage_bits : columns;
  for (const mpt::Format& f : formats) dot += format_row(f, columns);
  dot += "</TABLE>>];\n}\n";
  return dot;
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) {
    std::cerr << "mpt_diagrams: cannot write " << path << "\n";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: mpt_diagrams OUT_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // a failure shows up as "cannot write"
  const auto& formats = mpt::all_formats();
  bool ok = write_file(dir + "/ch01_layouts.dot", layout_graph("ch01_layouts", formats, true));
  for (const mpt::Format& f : formats) {
    const mpt::Format one[] = {f};
    ok = write_file(dir + "/layout_" + std::string(f.name) + ".dot",
                    layout_graph("layout_" + std::string(f.name), one, false)) &&
         ok;
  }
  return ok ? 0 : 1;
}
