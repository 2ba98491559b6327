// The JSON writers the OTLP encoders, the live page and the requests API
// share: string escaping.
#include "daemon/base/json_write.h"

#include <gtest/gtest.h>

#include <string>

namespace tokenmeter::daemon::json_write {
namespace {

TEST(JsonStringTest, EscapesQuotesBackslashesAndControls) {
  std::string out;
  JsonString(&out, "a\"b\\c\nd\te\x01\x1f<é>");
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\nd\\te\\u0001\\u001f<é>\"");
}

}  // namespace
}  // namespace tokenmeter::daemon::json_write
