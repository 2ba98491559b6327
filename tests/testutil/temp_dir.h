// A per-test temporary directory, short enough for Unix socket paths.
#ifndef TOKENMETER_TESTS_TESTUTIL_TEMP_DIR_H_
#define TOKENMETER_TESTS_TESTUTIL_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace tokenmeter::testutil {

// A fresh directory under /tmp (short, so that socket paths fit sun_path's
// 108 bytes), removed with its contents on destruction. path() is empty when
// mkdtemp() failed; tests check that first.
class TempDir {
 public:
  TempDir() {
    char templ[] = "/tmp/tmt.XXXXXX";
    if (mkdtemp(templ) != nullptr) path_ = templ;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace tokenmeter::testutil

#endif  // TOKENMETER_TESTS_TESTUTIL_TEMP_DIR_H_
