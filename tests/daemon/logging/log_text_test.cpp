// AppendLogText(): what a log line may carry of a peer's string.
#include "daemon/logging/log_text.h"

#include <gtest/gtest.h>

#include <string>

namespace tokenmeter::daemon {
namespace {

using namespace std::string_literals;

TEST(LogTextTest, PrintableTextIsCopied) {
  EXPECT_EQ(LogText(""), "");
  EXPECT_EQ(LogText("engine=0 model=m: 1.5 tokens/s"),
            "engine=0 model=m: 1.5 tokens/s");
  EXPECT_EQ(LogText("back\\slash \"quoted\" <0>"),
            "back\\slash \"quoted\" <0>");
  // Valid UTF-8 outside the controls: é, €, 😀.
  EXPECT_EQ(LogText("\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(LogTextTest, ControlCharactersAreEscaped) {
  EXPECT_EQ(LogText("m\n<0>FORGED"), "m\\n<0>FORGED");
  EXPECT_EQ(LogText("a\rb\tc"), "a\\rb\\tc");
  EXPECT_EQ(LogText("nul\0end"s), "nul\\x00end");
  EXPECT_EQ(LogText("\x1b[2J\x7f\x01\x1f"), "\\x1b[2J\\x7f\\x01\\x1f");
}

TEST(LogTextTest, C1ControlsAndLineSeparatorsAreEscaped) {
  EXPECT_EQ(LogText("\xc2\x80\xc2\x85\xc2\x9f\xc2\xa0"),
            "\\u0080\\u0085\\u009f\xc2\xa0");  // U+00A0 is printable
  EXPECT_EQ(LogText("a\xe2\x80\xa8"
                    "b\xe2\x80\xa9"),
            "a\\u2028b\\u2029");
}

TEST(LogTextTest, InvalidUtf8IsEscapedByteByByte) {
  EXPECT_EQ(LogText("\xff"), "\\xff");
  EXPECT_EQ(LogText("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(LogText("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");  // overlong
  EXPECT_EQ(LogText("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // U+D800
  EXPECT_EQ(LogText("\xf4\x90\x80\x80"),
            "\\xf4\\x90\\x80\\x80");               // above U+10FFFF
  EXPECT_EQ(LogText("m\xe2\x82"), "m\\xe2\\x82");  // truncated
  EXPECT_EQ(LogText("\x80"
                    "a"),
            "\\x80a");  // lone continuation
  // A bad lead byte does not swallow the valid text after it.
  EXPECT_EQ(LogText("\xc3\n"), "\\xc3\\n");
  EXPECT_EQ(LogText("\xe2\x82\xac\xe2"), "\xe2\x82\xac\\xe2");
}

TEST(LogTextTest, AppendsToWhatIsThere) {
  std::string out = "prefix ";
  AppendLogText("a\nb", &out);
  EXPECT_EQ(out, "prefix a\\nb");
}

}  // namespace
}  // namespace tokenmeter::daemon
