// Chapter 04 — a tiny language model: the character corpus, its vocabulary
// and the next-token windows.
// Depends on: mpt/nn/data/text_data.hpp, the core tier's Rng.
#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "mpt/core/random.hpp"
#include "mpt/nn/data/text_data.hpp"

using namespace mpt;

TEST_CASE("the vocabulary is the sorted distinct bytes, and encode/decode invert each other") {
  const TextCorpus c("banana band", "t");
  // Distinct bytes of "banana band": ' ' < 'a' < 'b' < 'd' < 'n'.
  CHECK(c.vocab_size() == 5);
  CHECK(c.encode(' ') == 0);
  CHECK(c.encode('a') == 1);
  CHECK(c.encode('n') == 4);
  CHECK(c.tokens().size() == 11);
  CHECK(c.tokens()[0] == c.encode('b'));
  CHECK(c.decode(c.tokens()) == "banana band");
  CHECK(c.decode(c.encode("dab")) == "dab");
}

TEST_CASE("bytes above 127 are tokens too, sorted as unsigned") {
  const std::string s = std::string("a") + static_cast<char>(0xe2) + "b";
  const TextCorpus c(s);
  CHECK(c.vocab_size() == 3);
  CHECK(c.encode(static_cast<char>(0xe2)) == 2);  // after 'a' (97) and 'b' (98)
}

TEST_CASE("the checksum is FNV-1a: the published test values") {
  // FNV-1a 64-bit of "a" is 0xaf63dc4c8601ec8c, of "foobar" 0x85944171f73967e8
  // (the reference values of the FNV authors' test suite).
  CHECK(TextCorpus("a").checksum() == 0xaf63dc4c8601ec8cull);
  CHECK(TextCorpus("foobar").checksum() == 0x85944171f73967e8ull);
}

TEST_CASE("bad input: empty text, unknown byte, id outside the vocabulary — one line each") {
  CHECK_THROWS_WITH_AS(TextCorpus(""), "text corpus 'text' is empty; it needs at least one byte",
                       std::invalid_argument);
  const TextCorpus c("ab");
  CHECK_THROWS_WITH_AS(c.encode('z'),
                       "byte 122 does not occur in the corpus 'text' (its vocabulary has 2 bytes)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(c.decode({0, 2}), "token id 2 is outside the vocabulary [0, 2)",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(load_common_licenses("/nonexistent-dir"),
                       doctest::Contains("cannot read /nonexistent-dir/Apache-2.0"), std::runtime_error);
}

TEST_CASE("windows: targets are the inputs shifted by one, inside the range, seeded") {
  const TextCorpus c("the quick brown fox jumps over the lazy dog");
  const auto& tok = c.tokens();
  Rng rng(7);
  const TokenBatch b = sample_windows(tok, 4, 30, 16, 5, rng);
  REQUIRE(b.inputs.size() == 80);
  REQUIRE(b.targets.size() == 80);
  const std::string& text = c.text();
  for (std::ptrdiff_t w = 0; w < 16; ++w) {
    const std::vector<int> in(b.inputs.begin() + w * 5, b.inputs.begin() + w * 5 + 5);
    const std::vector<int> tg(b.targets.begin() + w * 5, b.targets.begin() + w * 5 + 5);
    const std::string si = c.decode(in), st = c.decode(tg);
    const std::size_t at = text.find(si + st.back(), 4);
    REQUIRE(at != std::string::npos);
    CHECK(at + 6 <= 30);                     // the window and its last target lie in [4, 30)
    CHECK(si.substr(1) == st.substr(0, 4));  // shifted by one
  }
  Rng again(7);
  CHECK(sample_windows(tok, 4, 30, 16, 5, again).inputs == b.inputs);
  CHECK_THROWS_WITH_AS(sample_windows(tok, 0, 5, 1, 5, rng),
                       "sample_windows: the range [0, 5) of 43 tokens must hold more than context = 5 tokens",
                       std::invalid_argument);
  CHECK_THROWS_AS(sample_windows(tok, 0, 10, 0, 5, rng), std::invalid_argument);
}

TEST_CASE("every window start is reachable: the last one included") {
  const TextCorpus c("abcdefgh");
  Rng rng(1);
  std::set<int> firsts;
  for (int i = 0; i < 200; ++i) firsts.insert(sample_windows(c.tokens(), 0, 8, 1, 3, rng).inputs[0]);
  // Starts 0..4 (a window of 3 and its target need 4 tokens of the 8).
  CHECK(firsts == std::set<int>{0, 1, 2, 3, 4});
}

TEST_CASE("the split is 90 / 10, exact for any n") {
  const TextSplit s = split_text(1001);
  CHECK(s.train_begin == 0);
  CHECK(s.train_end == 900);  // ⌊900.9⌋
  CHECK(s.valid_begin == 900);
  CHECK(s.valid_end == 1001);
  CHECK(split_text(10).train_end == 9);
  CHECK(split_text(19).train_end == 17);  // ⌊17.1⌋
}

TEST_CASE("the licence corpus: every file read, in order, a vocabulary of printable text") {
  const TextCorpus c = load_common_licenses();
  CHECK(c.text().find("Apache License") < c.text().find("GNU GENERAL PUBLIC LICENSE"));
  CHECK(c.text().size() > 100000);
  CHECK(c.vocab_size() > 60);
  CHECK(c.vocab_size() < 128);
  CHECK(c.source() == "/usr/share/common-licenses: Apache-2.0 Artistic BSD GPL-2 GPL-3 LGPL-2.1 LGPL-3");
}
