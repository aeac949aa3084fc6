# Every public header under include/distribute/<GROUP> compiles on its own: a program may include any
# one of them first and alone. Internals (detail/) and CUDA headers (.cuh) are left out.
#
#   cmake -DCXX=<compiler> -DINCLUDE_DIR=<include> -DGROUP=<subfolder or "."> [-DFLAGS=<list>]
#         [-DEXCLUDE=<regex of headers whose dependency is missing>] -P check_headers.cmake
if(GROUP STREQUAL ".")
  file(GLOB headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/distribute/*.hpp)
else()
  file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR} ${INCLUDE_DIR}/distribute/${GROUP}/*.hpp)
endif()
list(FILTER headers EXCLUDE REGEX "/detail/")
if(EXCLUDE)
  list(FILTER headers EXCLUDE REGEX "${EXCLUDE}")
endif()
list(SORT headers)
if(NOT headers)
  message(FATAL_ERROR "no headers under distribute/${GROUP}")
endif()
set(work ${CMAKE_CURRENT_BINARY_DIR}/header_check_${GROUP})
string(REPLACE "." "top" work "${work}")
file(MAKE_DIRECTORY ${work})
set(failed "")
foreach(header IN LISTS headers)
  string(MAKE_C_IDENTIFIER "${header}" name)
  file(WRITE ${work}/${name}.cpp "#include <${header}>\n")
  execute_process(
    COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE_DIR} ${FLAGS} ${work}/${name}.cpp
    RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND failed ${header})
    message("${header} does not compile on its own:\n${err}")
  endif()
endforeach()
list(LENGTH headers count)
if(failed)
  message(FATAL_ERROR "headers that do not compile on their own: ${failed}")
endif()
message(STATUS "${count} headers under distribute/${GROUP} compile on their own")
