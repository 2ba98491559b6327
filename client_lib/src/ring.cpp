#include "ring.h"

#include <sys/mman.h>

#include <cstring>

namespace tokenmeter::client {

Ring::Ring(size_t capacity_words)
    : capacity_(capacity_words), mask_(capacity_words - 1) {
  // mmap rather than new[]: large, page-aligned, and returned to the OS on
  // free. MAP_POPULATE plus the memset below fault every page in now, so the
  // producer never takes a page fault on its first pass through the ring.
  void* p = mmap(nullptr, capacity_ * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return;
  std::memset(p, 0, capacity_ * sizeof(uint64_t));
  words_ = static_cast<uint64_t*>(p);
}

Ring::~Ring() {
  if (words_ != nullptr) munmap(words_, capacity_ * sizeof(uint64_t));
}

}  // namespace tokenmeter::client
