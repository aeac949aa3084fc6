# Drives one consumer test from ctest:  cmake -DMODE=<find_package|add_subdirectory>
#   -DSOURCE_DIR=<distribute source> -DWORK_DIR=<scratch dir, owned by this test>
#   [-DGENERATOR=...] [-DCONFIG=...] [-DCXX_COMPILER=...] [-DCXX_FLAGS=...] [-DEXE_LINKER_FLAGS=...]
#   -P run_consumer_test.cmake
# Any failing step stops the script with an error, which fails the test.
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS MODE SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

# Settings every configure step shares: the parent build's toolchain, and no user package registry
# that could hide a broken install.
set(common_args
  -DCMAKE_BUILD_TYPE=${CONFIG}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(GENERATOR)
  list(APPEND common_args -G ${GENERATOR})
endif()
if(CXX_COMPILER)
  list(APPEND common_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(CXX_FLAGS)
  list(APPEND common_args "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
endif()
if(EXE_LINKER_FLAGS)
  list(APPEND common_args "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}")
endif()

function(step description)
  message(STATUS "consumer test (${MODE}): ${description}")
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT COMMAND_ERROR_IS_FATAL ANY)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(consumer_source ${CMAKE_CURRENT_LIST_DIR})
set(consumer_build ${WORK_DIR}/consumer-build)

if(MODE STREQUAL "find_package")
  set(prefix ${WORK_DIR}/prefix)
  # CUDA is off: the package's files do not depend on it and probing for nvcc is slow.
  step("configure distribute"
    ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/distribute-build ${common_args}
      -DCMAKE_INSTALL_PREFIX=${prefix}
      -DDISTRIBUTE_BUILD_TESTS=OFF -DDISTRIBUTE_BUILD_EXAMPLES=OFF -DDISTRIBUTE_BUILD_BENCHMARKS=OFF
      -DDISTRIBUTE_ENABLE_CUDA=OFF)
  step("build distribute" ${CMAKE_COMMAND} --build ${WORK_DIR}/distribute-build --config ${CONFIG})
  step("install distribute" ${CMAKE_COMMAND} --install ${WORK_DIR}/distribute-build --config ${CONFIG})
  step("configure consumer"
    ${CMAKE_COMMAND} -S ${consumer_source} -B ${consumer_build} ${common_args}
      -DDISTRIBUTE_CONSUMER_MODE=find_package
      -DCMAKE_PREFIX_PATH=${prefix})
  # The package must come from the fresh prefix, not from some other install on this machine.
  file(STRINGS ${consumer_build}/CMakeCache.txt found_dir REGEX "^distribute_DIR:")
  string(REGEX REPLACE "^distribute_DIR:[A-Z]+=" "" found_dir "${found_dir}")
  cmake_path(IS_PREFIX prefix "${found_dir}" NORMALIZE from_prefix)
  if(NOT from_prefix)
    message(FATAL_ERROR "find_package(distribute) used '${found_dir}', not the fresh prefix '${prefix}'")
  endif()
elseif(MODE STREQUAL "add_subdirectory")
  step("configure consumer"
    ${CMAKE_COMMAND} -S ${consumer_source} -B ${consumer_build} ${common_args}
      -DDISTRIBUTE_CONSUMER_MODE=add_subdirectory
      -DDISTRIBUTE_SOURCE_DIR=${SOURCE_DIR}
      -DDISTRIBUTE_ENABLE_CUDA=OFF)
else()
  message(FATAL_ERROR "run_consumer_test.cmake: MODE must be find_package or add_subdirectory, not '${MODE}'")
endif()

step("build consumer" ${CMAKE_COMMAND} --build ${consumer_build} --config ${CONFIG})

# Single-config generators put the program at the top of the build dir, multi-config ones in <CONFIG>/.
set(exe_suffix "")
if(CMAKE_HOST_WIN32)
  set(exe_suffix .exe)
endif()
set(program ${consumer_build}/consumer${exe_suffix})
if(NOT EXISTS ${program})
  set(program ${consumer_build}/${CONFIG}/consumer${exe_suffix})
endif()
step("run consumer" ${program})
message(STATUS "consumer test (${MODE}): passed")
