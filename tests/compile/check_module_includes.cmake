# The library's modules keep their internals to themselves, and its headers stay readable:
#   1. no header includes another module's detail/ (a module is a folder of include/distribute; a
#      backend's folder of it, such as cuda/comm, belongs to it: the CUDA collectives build on comm's
#      internals, as Thrust's system/cuda on its generic system/detail; the top-level headers and
#      the library-wide internals in distribute/detail/ form the root module, whose detail/ every
#      module may use);
#   2. no header includes a module above its own (the arrows listed in FORBIDDEN below, the layer
#      picture of docs/architecture.md);
#   3. no header is over 600 lines unless it says why near its top (a comment naming "600 lines").
#
#   cmake -DINCLUDE_DIR=<include> -P check_module_includes.cmake
cmake_policy(SET CMP0007 NEW)
if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "usage: cmake -DINCLUDE_DIR=<include> -P check_module_includes.cmake")
endif()

# "from|to": a header of module `from` (or of its backend folders) may not include a header of
# module `to` (or of its backend folders).
set(FORBIDDEN
  "device|tensor" "device|engine" "device|comm" "tensor|engine" "tensor|comm"
  "data|nn" "data|optim" "data|strategy" "checkpoint|nn" "checkpoint|optim" "summary|nn"
  "concepts|nn" "concepts|optim" "concepts|strategy" "concepts|data" "concepts|pipeline"
  "tensor|nn" "tensor|optim" "tensor|strategy"
  "engine|nn" "engine|optim" "engine|strategy" "engine|comm"
  "comm|nn" "comm|optim" "comm|strategy" "comm|pipeline"
  "nn|optim" "nn|strategy" "nn|pipeline"
  "optim|strategy" "optim|pipeline"
  "strategy|nn" "strategy|optim" "strategy|pipeline")

function(_module_of path out)
  # path relative to include/distribute
  if(path MATCHES "^cuda/([^/]+)/")
    set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  elseif(path MATCHES "^([^/]+)/" AND NOT CMAKE_MATCH_1 STREQUAL "detail")
    set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR}/distribute ${INCLUDE_DIR}/distribute/*.hpp ${INCLUDE_DIR}/distribute/*.cuh)
list(SORT headers)
set(problems "")
set(checked 0)
set(includes 0)
foreach(header IN LISTS headers)
  math(EXPR checked "${checked} + 1")
  _module_of("${header}" from)
  file(STRINGS ${INCLUDE_DIR}/distribute/${header} lines REGEX "^[ \t]*#[ \t]*include[ \t]*<distribute/")
  foreach(line IN LISTS lines)
    math(EXPR includes "${includes} + 1")
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*<distribute/([^>]+)>.*$" "\\1" target "${line}")
    _module_of("${target}" to)
    if(NOT to STREQUAL from AND target MATCHES "(^|/)detail/" AND NOT target MATCHES "^detail/")
      list(APPEND problems "${header}: includes another module's internals: <distribute/${target}>")
    endif()
    foreach(rule IN LISTS FORBIDDEN)
      string(REPLACE "|" ";" pair "${rule}")
      list(GET pair 0 rule_from)
      list(GET pair 1 rule_to)
      if(from STREQUAL rule_from AND to STREQUAL rule_to)
        list(APPEND problems "${header}: module ${from} includes <distribute/${target}> of module ${to}, above it")
      endif()
    endforeach()
  endforeach()
  file(READ ${INCLUDE_DIR}/distribute/${header} text)
  string(REGEX MATCHALL "\n" newlines "${text}")
  list(LENGTH newlines length)
  if(length GREATER 600)
    string(SUBSTRING "${text}" 0 5000 top)
    string(FIND "${top}" "600 lines" at)
    if(at EQUAL -1)
      list(APPEND problems "${header}: ${length} lines, and no reason near its top (a comment naming \"600 lines\")")
    endif()
  endif()
endforeach()
if(problems)
  list(JOIN problems "\n  " text)
  message(FATAL_ERROR "include layout:\n  ${text}")
endif()
message(STATUS "${checked} headers, ${includes} includes of the library: no module reaches into another's detail/, "
               "no arrow runs up, no header over 600 lines without a reason")
