#pragma once
// Argument checks shared by the communicators (the host ones here, the GPU ones under cuda/comm/): a
// wrong size is reported on the rank that made it, before any rank waits on another.

#include <cstddef>
#include <stdexcept>
#include <string>

namespace distribute::comm {

// `whole` must be exactly `ranks` blocks of `block` elements.
inline void check_block_sizes(const char* op, std::size_t whole, std::size_t block, int ranks) {
  if (whole != block * static_cast<std::size_t>(ranks))
    throw std::invalid_argument(std::string("distribute: ") + op + " needs the full buffer to hold " +
                                std::to_string(ranks) + " blocks of " + std::to_string(block) + " elements (" +
                                std::to_string(block * static_cast<std::size_t>(ranks)) + "), got " +
                                std::to_string(whole));
}

inline void check_root(int root, int ranks) {
  if (root < 0 || root >= ranks)
    throw std::invalid_argument("distribute: broadcast root " + std::to_string(root) + " is not a rank of a group of " +
                                std::to_string(ranks));
}

}  // namespace distribute::comm
