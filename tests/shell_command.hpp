#pragma once
// Running another program from a test (a Python reader of what the library wrote): the command
// line quoted for /bin/sh, and its output and exit status.

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <string>

#include <sys/wait.h>

namespace distribute::test {

// `s` as one /bin/sh word.
inline std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct command_result {
  int status = -1;  // the exit status, or 128 + the signal that ended it
  std::string output;
};

// Runs `command` under /bin/sh and reads its standard output to the end.
inline command_result run_command(const std::string& command) {
  command_result r;
  FILE* p = ::popen(command.c_str(), "r");
  BOOST_TEST_REQUIRE(p != nullptr, "cannot run " << command);
  char buf[65536];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace distribute::test
