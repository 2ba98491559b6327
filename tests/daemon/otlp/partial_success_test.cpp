// partial_success from export responses written by hand from the OTLP
// .proto definitions (ExportTraceServiceResponse: partial_success = 1;
// ExportTracePartialSuccess: rejected_spans = 1 (int64), error_message =
// 2 (string)) and the OTLP/JSON mapping.
#include "daemon/otlp/partial_success.h"

#include <gtest/gtest.h>

#include <string>

namespace tokenmeter::daemon::otlp {
namespace {

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s += static_cast<char>(x);
  return s;
}

TEST(PartialSuccessTest, ProtobufEmptyResponseHasNone) {
  EXPECT_EQ(ParseProtobufPartialSuccess(""), std::nullopt);
}

TEST(PartialSuccessTest, ProtobufRejectedAndMessage) {
  // 0a 07 | 08 03 | 12 03 'b' 'a' 'd'
  const auto p = ParseProtobufPartialSuccess(
      Bytes({0x0a, 0x07, 0x08, 0x03, 0x12, 0x03, 'b', 'a', 'd'}));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 3);
  EXPECT_EQ(p->error_message, "bad");
}

TEST(PartialSuccessTest, ProtobufMultiByteVarintAndUnknownFields) {
  // Unknown outer field 2 (varint), then partial_success with an unknown
  // fixed64 field 9 and rejected 300 (ac 02).
  const auto p =
      ParseProtobufPartialSuccess(Bytes({0x10, 0x05, 0x0a, 0x0c, 0x49, 1, 2, 3,
                                         4, 5, 6, 7, 8, 0x08, 0xac, 0x02}));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 300);
  EXPECT_EQ(p->error_message, "");
}

TEST(PartialSuccessTest, ProtobufEmptyPartialSuccessMeansZero) {
  const auto p = ParseProtobufPartialSuccess(Bytes({0x0a, 0x00}));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 0);
}

TEST(PartialSuccessTest, ProtobufMalformedIsIgnored) {
  EXPECT_EQ(ParseProtobufPartialSuccess(Bytes({0x0a, 0x05, 0x08})),
            std::nullopt);  // Length past the end.
  EXPECT_EQ(ParseProtobufPartialSuccess(Bytes({0x0a, 0x02, 0x08, 0x80})),
            std::nullopt);  // Varint cut short.
  EXPECT_EQ(ParseProtobufPartialSuccess(Bytes({0x0b})),
            std::nullopt);  // Group wire type.
  EXPECT_EQ(ParseProtobufPartialSuccess("{\"partialSuccess\":{}}"),
            std::nullopt);  // JSON is no protobuf.
}

TEST(PartialSuccessTest, ProtobufLongMessageIsCut) {
  std::string inner = Bytes({0x08, 0x01, 0x12, 0x90, 0x03});  // 400 bytes
  inner += std::string(400, 'x');
  std::string body = Bytes({0x0a, 0x95, 0x03}) + inner;  // 405 bytes
  const auto p = ParseProtobufPartialSuccess(body);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->error_message.size(), 256u);
}

TEST(PartialSuccessTest, JsonSpansAndDataPoints) {
  auto p = ParseJsonPartialSuccess(
      R"({"partialSuccess":{"rejectedSpans":"5","errorMessage":"too \"old\""}})");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 5);
  EXPECT_EQ(p->error_message, "too \\\"old\\\"");
  p = ParseJsonPartialSuccess(
      "{ \"partialSuccess\" : { \"rejectedDataPoints\" : 12 } }");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 12);
  p = ParseJsonPartialSuccess(R"({"partial_success":{"rejected_spans":2}})");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 2);
}

TEST(PartialSuccessTest, JsonWithoutCountHasNone) {
  EXPECT_EQ(ParseJsonPartialSuccess("{}"), std::nullopt);
  EXPECT_EQ(ParseJsonPartialSuccess(R"({"partialSuccess":{}})"), std::nullopt);
  EXPECT_EQ(
      ParseJsonPartialSuccess(R"({"partialSuccess":{"errorMessage":""}})"),
      std::nullopt);
  // A message outside a partialSuccess is not one.
  EXPECT_EQ(ParseJsonPartialSuccess(R"({"errorMessage":"x"})"), std::nullopt);
  EXPECT_EQ(ParseJsonPartialSuccess(R"({"rejectedSpans":"x"})"), std::nullopt);
  EXPECT_EQ(ParseJsonPartialSuccess(R"({"rejectedSpans":"5)"), std::nullopt);
  EXPECT_EQ(ParseJsonPartialSuccess(R"({"rejectedSpans" 5})"), std::nullopt);
}

// Proto3 JSON leaves out a zero count: a warning with all items accepted
// is the message alone.
TEST(PartialSuccessTest, JsonWarningWithoutCountIsRejectedZero) {
  auto p = ParseJsonPartialSuccess(
      R"({"partialSuccess":{"errorMessage":"attribute cut to 4096 bytes"}})");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 0);
  EXPECT_EQ(p->error_message, "attribute cut to 4096 bytes");
  p = ParseJsonPartialSuccess(R"({"partial_success":{"error_message":"w"}})");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->rejected, 0);
  EXPECT_EQ(p->error_message, "w");
}

}  // namespace
}  // namespace tokenmeter::daemon::otlp
