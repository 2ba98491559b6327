// --web-config: what loads, and one test per way a file can be bad (each a
// start-up error with one line naming the file and the fault).
#include "daemon/http/web_config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "daemon/http/basic_auth.h"
#include "test_certs.h"
#include "testutil/temp_dir.h"

namespace tokenmeter::daemon::http {
namespace {

using testutil::Basic;
using testutil::BcryptHash;
using testutil::TempDir;
using testutil::WriteSelfSignedCert;

class WebConfigTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_TRUE(
        WriteSelfSignedCert(dir_.File("server.crt"), dir_.File("server.key")));
    hash_ = BcryptHash("secret");
    ASSERT_FALSE(hash_.empty());
  }

  std::string Write(const std::string& text) {
    std::string path = dir_.File("web.yml");
    std::ofstream(path) << text;
    return path;
  }

  // Loads `text` and returns the error line ("" when it loaded).
  std::string ErrorOf(const std::string& text) {
    WebConfig config;
    Status s = WebConfig::Load(Write(text), &config);
    return s.ok() ? "" : s.message();
  }

  TempDir dir_;
  std::string hash_;
};

TEST_F(WebConfigTest, LoadsTlsAndUsersWithPathsRelativeToTheFile) {
  WebConfig config;
  ASSERT_TRUE(WebConfig::Load(Write("tls_server_config:\n"
                                    "  cert_file: server.crt\n"
                                    "  key_file: server.key\n"
                                    "basic_auth_users:\n"
                                    "  prometheus: " +
                                    hash_ + "\n"),
                              &config)
                  .ok());
  ASSERT_NE(config.tls, nullptr);
  ASSERT_NE(config.basic_auth, nullptr);
  EXPECT_TRUE(config.basic_auth->Check(Basic("prometheus:secret")));
  EXPECT_TRUE(config.basic_auth->Check(Basic("prometheus:secret")));  // cached
  EXPECT_FALSE(config.basic_auth->Check(Basic("prometheus:Secret")));
  EXPECT_FALSE(config.basic_auth->Check(Basic("other:secret")));
  EXPECT_TRUE(config.basic_auth->Check("basic " +
                                       Basic("prometheus:secret").substr(6)));
  // Absolute paths work too.
  EXPECT_EQ(
      ErrorOf("tls_server_config:\n  cert_file: " + dir_.File("server.crt") +
              "\n  key_file: " + dir_.File("server.key") + "\n"),
      "");
}

TEST_F(WebConfigTest, EmptyFileOrSectionsChangeNothing) {
  WebConfig config;
  ASSERT_TRUE(WebConfig::Load(Write(""), &config).ok());
  EXPECT_EQ(config.tls, nullptr);
  EXPECT_EQ(config.basic_auth, nullptr);
  ASSERT_TRUE(
      WebConfig::Load(Write("tls_server_config:\nbasic_auth_users:\n"), &config)
          .ok());
  EXPECT_EQ(config.tls, nullptr);
  EXPECT_EQ(config.basic_auth, nullptr);
}

TEST_F(WebConfigTest, MissingFileIsAnError) {
  WebConfig config;
  Status s = WebConfig::Load(dir_.File("absent.yml"), &config);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("absent.yml"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cannot read"), std::string::npos) << s.message();
}

TEST_F(WebConfigTest, YamlErrorNamesTheLine) {
  std::string e = ErrorOf("tls_server_config:\n  cert_file: [unclosed\n");
  EXPECT_NE(e.find("--web-config \"" + dir_.File("web.yml") + "\""),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("YAML error at line"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST_F(WebConfigTest, UnknownKeysAreErrors) {
  EXPECT_NE(ErrorOf("http_server_config:\n  http2: false\n")
                .find("unknown or unsupported key \"http_server_config\""),
            std::string::npos);
  EXPECT_NE(ErrorOf("tls_server_config:\n  cert_file: server.crt\n"
                    "  key_file: server.key\n  client_ca_file: ca.crt\n")
                .find("key \"client_ca_file\""),
            std::string::npos);
  EXPECT_NE(ErrorOf("- a\n- b\n").find("expected a mapping"),
            std::string::npos);
}

TEST_F(WebConfigTest, MissingOrUnreadableCertIsAnError) {
  std::string e = ErrorOf(
      "tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n");
  EXPECT_NE(e.find("cannot read cert_file \"" + dir_.File("nope.crt") +
                   "\": No such file or directory"),
            std::string::npos)
      << e;
  e = ErrorOf(
      "tls_server_config:\n  cert_file: server.crt\n"
      "  key_file: nope.key\n");
  EXPECT_NE(e.find("cannot read key_file"), std::string::npos) << e;
  e = ErrorOf("tls_server_config:\n  cert_file: server.crt\n");
  EXPECT_NE(e.find("both cert_file and key_file"), std::string::npos) << e;
  // A directory opens but does not read as a certificate.
  ASSERT_EQ(mkdir(dir_.File("d").c_str(), 0700), 0);
  e = ErrorOf("tls_server_config:\n  cert_file: d\n  key_file: server.key\n");
  EXPECT_NE(e.find("cannot load cert_file"), std::string::npos) << e;
}

TEST_F(WebConfigTest, BadPemOrMismatchedKeyIsAnError) {
  std::ofstream(dir_.File("garbage.crt")) << "not a certificate\n";
  std::string e = ErrorOf(
      "tls_server_config:\n  cert_file: garbage.crt\n  key_file: server.key\n");
  EXPECT_NE(e.find("cannot load cert_file"), std::string::npos) << e;
  ASSERT_TRUE(
      WriteSelfSignedCert(dir_.File("other.crt"), dir_.File("other.key")));
  e = ErrorOf(
      "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n");
  EXPECT_NE(e.find("mismatch"), std::string::npos) << e;
}

TEST_F(WebConfigTest, PasswordThatIsNotABcryptHashIsAnError) {
  for (const std::string& bad :
       {std::string("secret"), std::string("$1$abc$def"),
        std::string("$2y$10$short"), hash_.substr(0, 59) + "!",
        std::string("[a, b]")}) {
    std::string e = ErrorOf("basic_auth_users:\n  prometheus: " + bad + "\n");
    EXPECT_NE(e.find("prometheus"), std::string::npos) << bad << ": " << e;
    EXPECT_FALSE(e.empty()) << bad;
  }
  EXPECT_NE(
      ErrorOf("basic_auth_users:\n  - prometheus\n").find("expected a mapping"),
      std::string::npos);
}

TEST(BasicAuthTest, MalformedAuthorizationIsRefused) {
  std::unique_ptr<BasicAuth> auth;
  ASSERT_TRUE(BasicAuth::Create({{"u", BcryptHash("p")}}, &auth).ok());
  EXPECT_TRUE(auth->Check(Basic("u:p")));
  for (const std::string& bad :
       {std::string(""), std::string("Basic"), std::string("Basic "),
        std::string("Bearer dTpw"), std::string("Basic dTpw="),
        std::string("Basic dT=w"), std::string("Basic d*pw"), Basic("u"),
        Basic("u:"), Basic(":p"), Basic("u:p:"),
        Basic(std::string("u:p\0x", 5))}) {
    EXPECT_FALSE(auth->Check(bad)) << bad;
  }
}

}  // namespace
}  // namespace tokenmeter::daemon::http
