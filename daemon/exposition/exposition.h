// Rendering the registry: the engine families of every namespace (from the
// catalog table, one generic loop per metric type and label shape), then
// the daemon families in catalog order, each written by the Collector that
// owns it (families nobody owns are left out).
#ifndef TOKENMETER_DAEMON_EXPOSITION_EXPOSITION_H_
#define TOKENMETER_DAEMON_EXPOSITION_EXPOSITION_H_

#include <string>

#include "daemon/exposition/text_writer.h"
#include "daemon/store/metric_writer.h"
#include "daemon/store/registry.h"

namespace tokenmeter::daemon {

// Writes the whole exposition to `w` (ending with w.Finish()).
void Render(const Registry& registry, MetricWriter& w);

// Appends the whole exposition in a text format to `out`.
void Render(const Registry& registry, ExpositionFormat format,
            std::string& out);

}  // namespace tokenmeter::daemon

#endif  // TOKENMETER_DAEMON_EXPOSITION_EXPOSITION_H_
