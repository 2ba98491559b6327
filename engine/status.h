// Status: the result of an operation that can fail because of the
// environment or the user (a bad flag, no CUDA device, a CUDA error, a file
// that cannot be written). Carries one human-readable line for main() to
// print. Broken invariants abort() instead.
//
// C++17-clean: model_cuda.cu includes it through nvcc -std=c++17.
#ifndef TOKENMETER_ENGINE_STATUS_H_
#define TOKENMETER_ENGINE_STATUS_H_

#include <string>
#include <utility>

namespace tokenmeter::engine {

class [[nodiscard]] Status {
 public:
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

 private:
  Status() = default;
  bool ok_ = true;
  std::string message_;
};

}  // namespace tokenmeter::engine

#endif  // TOKENMETER_ENGINE_STATUS_H_
