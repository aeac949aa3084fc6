#pragma once
// Settings shared by every collective engine.

#include <chrono>

namespace distribute {

struct collective_options {
  // How long a replica waits in a collective for the others before it fails with
  // `collective_timeout`. A replica that leaves the step without joining is reported at once.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

}  // namespace distribute
