// The CUDA entry points of a build without nvcc (or with -Dcuda=disabled).
#include "engine/model.h"

namespace tokenmeter::engine {

bool CudaBuilt() { return false; }

bool CudaDeviceAvailable(std::string* why) {
  if (why != nullptr) *why = "this build has no CUDA backend";
  return false;
}

Status MakeCudaModel(const Weights&, const KvLayout&, const LoraLayout&,
                     std::unique_ptr<Model>*) {
  return Status::Error("this build has no CUDA backend (built without nvcc)");
}

}  // namespace tokenmeter::engine
