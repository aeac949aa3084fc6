#pragma once
// The one error type of checkpoints: a missing, truncated or corrupt file, a section that is absent,
// or saved state that does not fit the object it is loaded into. The message names the file or
// section and what is wrong.

#include <stdexcept>

namespace distribute::checkpoint {

struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace distribute::checkpoint
