# The umbrella header's preprocessed size stays under a bound: a regression guard for what
# <distribute/distribute.hpp> pulls into every program (docs/compile_time.md). The bound is the
# measured size plus a margin; raise it only for a reason a user would accept.
#
#   cmake -DCXX=<compiler> -DINCLUDE_DIR=<include> -DMAX_LINES=<n> [-DFLAGS=<list>] -P check_umbrella_size.cmake
string(MD5 flags_tag "${FLAGS}")  # one file per set of flags: the tests may run at once
set(source ${CMAKE_CURRENT_BINARY_DIR}/umbrella_size_${flags_tag}.cpp)
file(WRITE ${source} "#include <distribute/distribute.hpp>\n")
execute_process(
  COMMAND ${CXX} -std=c++20 -E -I${INCLUDE_DIR} ${FLAGS} ${source}
  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "preprocessing the umbrella header failed:\n${err}")
endif()
string(REGEX MATCHALL "\n" newlines "${text}")
list(LENGTH newlines lines)
string(LENGTH "${text}" bytes)
message(STATUS "<distribute/distribute.hpp> preprocesses to ${lines} lines, ${bytes} bytes with flags '${FLAGS}' (bound ${MAX_LINES} lines)")
if(lines GREATER MAX_LINES)
  message(FATAL_ERROR "the umbrella header grew to ${lines} preprocessed lines, over the bound of ${MAX_LINES}: "
                      "find what it pulls in with `g++ -H` (docs/compile_time.md)")
endif()
