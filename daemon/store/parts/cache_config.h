// The HELLO cache_config (protocol 1.1): vLLM's cache_config_info, and the
// per-key gauges SGLang shows (page_size, num_pages). A series has this
// part once a HELLO sent cache_config; the latest such HELLO's entries win.
//
// Single-threaded: the daemon's loop.
#ifndef TOKENMETER_DAEMON_STORE_PARTS_CACHE_CONFIG_H_
#define TOKENMETER_DAEMON_STORE_PARTS_CACHE_CONFIG_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/store/part.h"

namespace tokenmeter::daemon {

// One cache_config entry, as the frame decoder reads it from HELLO and
// the part keeps it: the key, the value rendered as the catalog says (str
// as given, int decimal, float shortest round trip, bool True/False), and
// the number of an int or float value (NaN for the others).
struct CacheConfigEntry {
  std::string key;
  std::string value;
  double number;
};

class CacheConfigPart : public Part {
 public:
  static constexpr PartKind kKind = PartKind::kCacheConfig;
  explicit CacheConfigPart(const EngineSeries& series);

  // The entries of the latest HELLO that sent cache_config, in HELLO order
  // (at most TM_MAX_CACHE_CONFIG). O(entries): the sample labels are
  // rendered here, once.
  void Set(std::vector<CacheConfigEntry> entries);
  const std::vector<CacheConfigEntry>& entries() const { return entries_; }
  // The entry `key` if its value is a number, else nullptr.
  const CacheConfigEntry* FindNumber(std::string_view key) const;
  // cache_config_info's sample labels (the series', then the entries).
  const std::string& info_text() const { return text_; }
  const std::vector<std::pair<std::string, std::string>>& info_pairs() const {
    return pairs_;
  }

  PartKind kind() const override { return kKind; }
  bool Shows(const FamilyDef& f, const RegistryOptions& o) const override;
  void Write(const FamilyDef& f, const EngineSeries& s,
             MetricWriter& w) const override;
  void SaveState(StateWriter& w) const override;
  void LoadState(StateReader& r) override;

 private:
  const EngineSeries& series_;
  std::vector<CacheConfigEntry> entries_;
  std::string text_;
  std::vector<std::pair<std::string, std::string>> pairs_;
};

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_STORE_PARTS_CACHE_CONFIG_H_
