#pragma once
// The error of the input pipeline: bytes from outside (files, images) that cannot be read. Its
// message names the file and what is wrong with it, because the user has to go and fix that file.

#include <stdexcept>
#include <string>

namespace distribute::data {

struct input_error : std::runtime_error {
  input_error(const std::string& file, const std::string& problem)
      : std::runtime_error("distribute::data: " + file + ": " + problem), file_(file) {}
  const std::string& file() const noexcept { return file_; }

 private:
  std::string file_;
};

}  // namespace distribute::data
