// Number formatting and escaping for the text exposition: shortest
// round-trip doubles, independent of the process locale.
#include "daemon/base/text_format.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <charconv>
#include <clocale>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <locale>
#include <random>
#include <string>
#include <utility>

#include "daemon/exposition/exposition.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {
namespace {

std::string Double(double v) {
  std::string s;
  AppendDouble(s, v);
  return s;
}

struct DoubleCase {
  double value;
  const char* text;
};

TEST(TextFormatTest, AppendDoubleGivesShortestRoundTrip) {
  const double inf = std::numeric_limits<double>::infinity();
  const DoubleCase cases[] = {
      {0.1, "0.1"},
      {1e-9, "1e-09"},
      {2560, "2560"},
      {1.5e300, "1.5e+300"},
      {inf, "+Inf"},
      {-inf, "-Inf"},
      {std::numeric_limits<double>::quiet_NaN(), "NaN"},
      {0, "0"},
      {0.25, "0.25"},
      {-2.5, "-2.5"},
      {0.123456789, "0.123456789"},
      {0.3, "0.3"},
      {1.0 / 3.0, "0.3333333333333333"},
      {20000, "20000"},
      {9007199254740992.0, "9007199254740992"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
  };
  for (const DoubleCase& c : cases) {
    EXPECT_EQ(Double(c.value), c.text) << "value " << c.text;
  }
}

TEST(TextFormatTest, AppendDoubleReadsBackExactly) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double v;
    static_assert(sizeof v == sizeof bits);
    std::memcpy(&v, &bits, sizeof v);
    if (!std::isfinite(v)) continue;
    const std::string s = Double(v);
    double back = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), back);
    ASSERT_EQ(ec, std::errc()) << s;
    ASSERT_EQ(end, s.data() + s.size()) << s;
    ASSERT_EQ(back, v) << s;
    // Exposed nanosecond quotients too.
    const double seconds = double(bits >> 20) / 1e9;
    const std::string t = Double(seconds);
    ASSERT_EQ(std::strtod(t.c_str(), nullptr), seconds) << t;
  }
}

TEST(TextFormatTest, AppendUint) {
  std::string s;
  AppendUint(s, 0);
  s += ' ';
  AppendUint(s, 18446744073709551615ull);
  EXPECT_EQ(s, "0 18446744073709551615");
}

TEST(TextFormatTest, EscapesLabelValues) {
  struct {
    const char* in;
    const char* out;
  } cases[] = {
      {"plain", "plain"},
      {"", ""},
      {"back\\slash", "back\\\\slash"},
      {"a \"quote\"", "a \\\"quote\\\""},
      {"new\nline", "new\\nline"},
      {"\\\"\n", "\\\\\\\"\\n"},
      {"tab\tstays", "tab\tstays"},
      {"ünïcode", "ünïcode"},
  };
  for (const auto& c : cases) {
    std::string s = "x=";
    AppendEscaped(s, c.in);
    EXPECT_EQ(s, std::string("x=") + c.out) << c.in;
  }
}

TEST(TextFormatTest, EscapesHelpBackslashAndNewlineOnly) {
  std::string s;
  AppendHelpEscaped(s, "a\\b \"q\"\nc");
  EXPECT_EQ(s, "a\\\\b \"q\"\\nc");
}

// ---- locale
// ------------------------------------------------------------------

class CommaNumpunct : public std::numpunct<char> {
 protected:
  char do_decimal_point() const override { return ','; }
  char do_thousands_sep() const override { return '.'; }
  std::string do_grouping() const override { return "\3"; }
};

// Switches the C locale's LC_NUMERIC to one with a decimal comma: an
// installed one if there is one, else one compiled with localedef into a
// temporary directory (LOCPATH). Returns false when neither works.
bool SetCommaCLocale(const std::filesystem::path& dir) {
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "de_DE", "fr_FR.UTF-8",
                           "fr_FR.utf8", "ru_RU.UTF-8", "nl_NL.UTF-8"}) {
    if (std::setlocale(LC_ALL, name) != nullptr &&
        *std::localeconv()->decimal_point == ',') {
      return true;
    }
  }
  std::setlocale(LC_ALL, "C");
  if (access("/usr/bin/localedef", X_OK) != 0) return false;
  const std::filesystem::path src = dir / "comma.src";
  std::ofstream(src) << "LC_NUMERIC\ndecimal_point \",\"\nthousands_sep "
                        "\".\"\ngrouping 3;3\nEND LC_NUMERIC\n";
  // -c: the other categories are missing on purpose (it then exits 1).
  const std::string cmd = "/usr/bin/localedef -c -i '" + src.string() +
                          "' -f ANSI_X3.4-1968 '" + (dir / "comma").string() +
                          "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) == -1) return false;
  setenv("LOCPATH", dir.c_str(), 1);
  const bool ok = std::setlocale(LC_NUMERIC, "comma") != nullptr &&
                  *std::localeconv()->decimal_point == ',';
  unsetenv("LOCPATH");
  return ok;
}

// Puts the C and C++ global locales back and removes the temporary
// directory, however the test ends.
class LocaleRestorer {
 public:
  explicit LocaleRestorer(std::filesystem::path dir)
      : dir_(std::move(dir)), old_global_(std::locale()) {}
  ~LocaleRestorer() {
    std::locale::global(old_global_);
    std::setlocale(LC_ALL, "C");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::filesystem::path dir_;
  std::locale old_global_;
};

TEST(TextFormatTest, IgnoresTheProcessLocale) {
  char tmpl[] = "/tmp/tm_locale_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::filesystem::path dir(tmpl);
  const LocaleRestorer restore(dir);
  const bool c_locale = SetCommaCLocale(dir);
  std::locale::global(std::locale(std::locale::classic(), new CommaNumpunct));
  if (c_locale) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", 0.25);
    EXPECT_STREQ(buf, "0,25") << "the comma locale did not take effect";
  } else {
    RecordProperty("c_locale", "no decimal-comma C locale available");
  }

  EXPECT_EQ(Double(0.25), "0.25");
  EXPECT_EQ(Double(1e-9), "1e-09");
  EXPECT_EQ(Double(1234567.5), "1234567.5");
  std::string u;
  AppendUint(u, 1234567);
  EXPECT_EQ(u, "1234567");
  // A whole exposition: le labels, sums and gauges.
  std::unique_ptr<Registry> reg;
  ASSERT_TRUE(Registry::Create(RegistryOptions{}, &reg).ok());
  EngineSeries* s = reg->GetOrCreate({"vllm", "m", "0", {}});
  ASSERT_NE(s, nullptr);
  s->Set(kKvCacheUsagePerc, 0.25);
  s->hist(kTimeToFirstToken).Observe(1'500'000);
  std::string text;
  Render(*reg, ExpositionFormat::kText004, text);
  EXPECT_NE(text.find("vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} "
                      "0.25\n"),
            std::string::npos);
  EXPECT_NE(text.find("le=\"0.005\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:time_to_first_token_seconds_sum{model_name=\"m\","
                      "engine=\"0\"} 0.0015\n"),
            std::string::npos);
  EXPECT_EQ(text.find("0,"), std::string::npos);
}

}  // namespace
}  // namespace tokenmeter::daemon
