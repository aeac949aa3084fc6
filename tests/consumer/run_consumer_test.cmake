# Drives one consumer test from ctest:
#   cmake -DMODE=<mode> -DSOURCE_DIR=<distribute source> -DWORK_DIR=<scratch dir, owned by this test>
#         [-DPREFIX=...] [-DGENERATOR=...] [-DCONFIG=...] [-DCXX_COMPILER=...] [-DCXX_FLAGS=...]
#         [-DEXE_LINKER_FLAGS=...] -P run_consumer_test.cmake
# Modes:
#   install            installs distribute twice under PREFIX: PREFIX/full with MPI and CUDA as
#                      ENABLE_MPI and ENABLE_CUDA say (CUDA_COMPILER: the nvcc to use), and PREFIX/core
#                      with both off. The other find_package modes use these trees.
#   find_package       builds and runs the consumer against PREFIX/full, asking for COMPONENTS
#                      (comma-separated) and the version in VERSION (major.minor); with the component
#                      mpi it builds and runs consumer_mpi instead (under MPIEXEC [MPIEXEC_PREFLAGS]
#                      -n 2 when MPIEXEC is given); with the component precompiled it builds and
#                      runs consumer_precompiled (the fast path's unit compiled in the consumer). HIDE (comma-separated package names) hides those
#                      packages from the consumer, as on a machine that lacks them.
#   add_subdirectory   builds and runs the consumer with the source tree vendored.
#   version            find_package(distribute <version>) against PREFIX/full: the version in VERSION
#                      and its major.minor are found; the next minor, the previous minor and the next
#                      major are not.
#   components         the components found when they can be provided, and not found with the reason
#                      when the installed tree lacks them or this machine lacks their dependency.
#   unknown_component  an unknown component name fails, naming it and the known components.
# Any failing step stops the script with an error, which fails the test.
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS MODE SOURCE_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT MODE MATCHES "^(install|find_package|add_subdirectory|version|components|unknown_component)$")
  message(FATAL_ERROR "run_consumer_test.cmake: MODE must be install, find_package, add_subdirectory, "
                      "version, components or unknown_component, not '${MODE}'")
endif()
if(NOT MODE STREQUAL "add_subdirectory" AND NOT PREFIX)
  message(FATAL_ERROR "run_consumer_test.cmake: MODE=${MODE} needs -DPREFIX=<install root>")
endif()
if(NOT CONFIG)
  set(CONFIG Release)
endif()
foreach(var IN ITEMS ENABLE_MPI ENABLE_CUDA)
  if(NOT ${var})
    set(${var} OFF)
  endif()
endforeach()
# Lists arrive comma-separated: a ';' would split the argument on ctest's command line.
string(REPLACE "," ";" COMPONENTS "${COMPONENTS}")
string(REPLACE "," ";" HIDE "${HIDE}")

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

# -DCMAKE_DISABLE_FIND_PACKAGE_<name>=ON for each name: find_package then finds nothing, as on a
# machine without that package.
function(hide_packages out)
  set(args "")
  foreach(package IN LISTS ARGN)
    list(APPEND args -DCMAKE_DISABLE_FIND_PACKAGE_${package}=ON)
  endforeach()
  set(${out} ${args} PARENT_SCOPE)
endfunction()

function(step description)
  message(STATUS "consumer test (${MODE}): ${description}")
  execute_process(COMMAND ${ARGN} COMMAND_ECHO STDOUT COMMAND_ERROR_IS_FATAL ANY)
endfunction()

# probe(<name> TREE <full|core> ARGS "<find_package arguments>" EXPECT <ok|error> [HIDE <package>...]
#       [OUTPUT <text>...])
# Configures tests/consumer/probe, which calls find_package(distribute <ARGS>) against PREFIX/<TREE>.
# EXPECT ok: the configure succeeds; error: it fails. Each OUTPUT text must appear in what it printed
# (whitespace runs compared as one space, since CMake wraps long messages).
function(probe name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "TREE;ARGS;EXPECT" "HIDE;OUTPUT")
  hide_packages(hide_args ${arg_HIDE})
  message(STATUS "consumer test (${MODE}): probe ${name}: find_package(distribute ${arg_ARGS})"
                 " in ${arg_TREE}; the configure should end ${arg_EXPECT}")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/probe -B ${WORK_DIR}/probe-${name} ${common_args}
      -DCMAKE_PREFIX_PATH=${PREFIX}/${arg_TREE} "-DDISTRIBUTE_PROBE_ARGS=${arg_ARGS}" ${hide_args}
    RESULT_VARIABLE rc OUTPUT_VARIABLE output ERROR_VARIABLE output)
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${output}")
  set(failure "")
  if(arg_EXPECT STREQUAL "ok" AND NOT rc EQUAL 0)
    set(failure "the configure failed (${rc})")
  elseif(arg_EXPECT STREQUAL "error" AND rc EQUAL 0)
    set(failure "the configure succeeded")
  endif()
  foreach(text IN LISTS arg_OUTPUT)
    string(FIND "${flat}" "${text}" at)
    if(at EQUAL -1)
      string(APPEND failure "\n  the output lacks: ${text}")
    endif()
  endforeach()
  if(failure)
    message(FATAL_ERROR "probe ${name}: find_package(distribute ${arg_ARGS}) in ${arg_TREE}: "
                        "${failure}\n--- its output:\n${output}")
  endif()
endfunction()

set(consumer_source ${CMAKE_CURRENT_LIST_DIR})
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

# The version in VERSION, and the major.minor a user writes in find_package.
file(STRINGS ${SOURCE_DIR}/VERSION version LIMIT_COUNT 1)
if(NOT version MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$")
  message(FATAL_ERROR "${SOURCE_DIR}/VERSION holds '${version}', not MAJOR.MINOR.PATCH")
endif()
set(major ${CMAKE_MATCH_1})
set(minor ${CMAKE_MATCH_2})
set(major_minor ${major}.${minor})

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE ${PREFIX})
  set(no_extras -DDISTRIBUTE_BUILD_TESTS=OFF -DDISTRIBUTE_BUILD_EXAMPLES=OFF -DDISTRIBUTE_BUILD_BENCHMARKS=OFF)
  set(full_args -DDISTRIBUTE_ENABLE_MPI=${ENABLE_MPI} -DDISTRIBUTE_ENABLE_CUDA=${ENABLE_CUDA})
  if(ENABLE_CUDA AND CUDA_COMPILER)
    list(APPEND full_args -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
  endif()
  foreach(tree IN ITEMS full core)
    if(tree STREQUAL "core")
      set(full_args -DDISTRIBUTE_ENABLE_MPI=OFF -DDISTRIBUTE_ENABLE_CUDA=OFF)
    endif()
    step("configure distribute (${tree})"
      ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/distribute-${tree} ${common_args} ${no_extras}
        -DCMAKE_INSTALL_PREFIX=${PREFIX}/${tree} ${full_args})
    step("install distribute (${tree})" ${CMAKE_COMMAND} --install ${WORK_DIR}/distribute-${tree} --config ${CONFIG})
  endforeach()
  # What the other modes may expect of PREFIX/full.
  file(WRITE ${PREFIX}/full/built_with.cmake
    "set(built_with_mpi ${ENABLE_MPI})\nset(built_with_cuda ${ENABLE_CUDA})\n")
  message(STATUS "consumer test (${MODE}): installed ${PREFIX}/full (MPI ${ENABLE_MPI}, CUDA ${ENABLE_CUDA}) "
                 "and ${PREFIX}/core")
  return()
endif()

if(NOT MODE STREQUAL "add_subdirectory")
  if(NOT EXISTS ${PREFIX}/full/built_with.cmake)
    message(FATAL_ERROR "no installed tree under ${PREFIX}: run the test core.package_install first")
  endif()
  include(${PREFIX}/full/built_with.cmake)
endif()

if(MODE STREQUAL "version")
  probe(same_version TREE full ARGS "${version} EXACT CONFIG" EXPECT ok
    OUTPUT "probe: distribute_FOUND=yes" "probe: distribute_VERSION=${version}")
  probe(same_minor TREE full ARGS "${major_minor} CONFIG" EXPECT ok OUTPUT "probe: distribute_FOUND=yes")
  math(EXPR next_minor "${minor} + 1")
  math(EXPR next_major "${major} + 1")
  set(incompatible ${major}.${next_minor} ${next_major}.0)
  if(minor GREATER 0)
    math(EXPR previous_minor "${minor} - 1")
    list(APPEND incompatible ${major}.${previous_minor})
  endif()
  foreach(requested IN LISTS incompatible)
    probe(v${requested} TREE full ARGS "${requested} CONFIG" EXPECT ok OUTPUT "probe: distribute_FOUND=no")
  endforeach()
  probe(required_next_minor TREE full ARGS "${major}.${next_minor} CONFIG REQUIRED" EXPECT error
    OUTPUT "compatible with requested version \"${major}.${next_minor}\"" "version: ${version}")
  list(JOIN incompatible ", " incompatible)
  message(STATUS "consumer test (${MODE}): ${version} found for ${version} and ${major_minor}; "
                 "not for ${incompatible}")
  return()
endif()

if(MODE STREQUAL "components")
  # The tree built without MPI and CUDA cannot provide them, and says why.
  probe(mpi_not_built TREE core ARGS "CONFIG REQUIRED COMPONENTS mpi" EXPECT error
    OUTPUT "distribute was installed without MPI support (DISTRIBUTE_ENABLE_MPI=OFF)")
  probe(cuda_not_built TREE core ARGS "CONFIG REQUIRED COMPONENTS cuda" EXPECT error
    OUTPUT "distribute was installed without CUDA support (DISTRIBUTE_ENABLE_CUDA=OFF)")
  probe(mpi_not_built_not_required TREE core ARGS "CONFIG COMPONENTS mpi" EXPECT ok
    OUTPUT "probe: distribute_FOUND=no" "probe: distribute_mpi_FOUND=no")
  probe(optional_not_built TREE core ARGS "CONFIG REQUIRED OPTIONAL_COMPONENTS mpi cuda" EXPECT ok
    OUTPUT "probe: distribute_FOUND=yes" "probe: distribute_mpi_FOUND=no" "probe: distribute_cuda_FOUND=no"
           "probe: target distribute::distribute=yes" "probe: target distribute::mpi=no"
           "probe: target distribute::cuda=no"
           "optional component mpi unavailable: distribute was installed without MPI support")
  # The tree built with them provides each one asked for, and only that one; a component whose
  # dependency this machine lacks is not found, and says so.
  set(checked "mpi and cuda not built")
  if(built_with_mpi)
    probe(mpi TREE full ARGS "${major_minor} CONFIG REQUIRED COMPONENTS mpi" EXPECT ok
      OUTPUT "probe: distribute_mpi_FOUND=yes" "probe: target distribute::mpi=yes"
             "probe: target distribute::cuda=no")
    probe(mpi_missing_here TREE full ARGS "CONFIG REQUIRED COMPONENTS mpi" HIDE MPI EXPECT error
      OUTPUT "mpi: it needs MPI for C++, which is not found here")
    string(APPEND checked "; mpi found, and not without MPI")
  endif()
  if(built_with_cuda)
    probe(cuda TREE full ARGS "${major_minor} CONFIG REQUIRED COMPONENTS cuda" EXPECT ok
      OUTPUT "probe: distribute_cuda_FOUND=yes" "probe: target distribute::cuda=yes"
             "probe: target distribute::mpi=no")
    probe(cuda_missing_here TREE full ARGS "CONFIG REQUIRED COMPONENTS cuda" HIDE CUDAToolkit EXPECT error
      OUTPUT "cuda: it needs the CUDA toolkit, which is not found here")
    string(APPEND checked "; cuda found, and not without the CUDA toolkit")
  endif()
  # The fast path needs Eigen on the consumer's machine, and says so.
  probe(precompiled_missing_here TREE core ARGS "CONFIG REQUIRED COMPONENTS precompiled" HIDE Eigen3 EXPECT error
    OUTPUT "precompiled: it compiles the CPU engine's Eigen code, and Eigen3 is not found here")
  string(APPEND checked "; precompiled not without Eigen")
  message(STATUS "consumer test (${MODE}): ${checked}")
  return()
endif()

if(MODE STREQUAL "unknown_component")
  probe(unknown_required TREE full ARGS "CONFIG REQUIRED COMPONENTS mpi nonesuch" EXPECT error
    OUTPUT "distribute has no component named nonesuch; its components are: mpi, cuda, precompiled")
  probe(unknown_optional TREE full ARGS "CONFIG OPTIONAL_COMPONENTS nonesuch" EXPECT ok
    OUTPUT "probe: distribute_FOUND=no" "distribute has no component named nonesuch")
  return()
endif()

if(MODE STREQUAL "find_package")
  hide_packages(hide_args ${HIDE})
  list(JOIN COMPONENTS "," components_arg)
  step("configure consumer (components: ${COMPONENTS}; hidden: ${HIDE})"
    ${CMAKE_COMMAND} -S ${consumer_source} -B ${consumer_build} ${common_args}
      -DDISTRIBUTE_CONSUMER_MODE=find_package
      -DDISTRIBUTE_CONSUMER_VERSION=${major_minor}
      -DDISTRIBUTE_CONSUMER_COMPONENTS=${components_arg}
      -DCMAKE_PREFIX_PATH=${PREFIX}/full
      ${hide_args})
  # The package must come from the fresh prefix, not from some other install on this machine.
  file(STRINGS ${consumer_build}/CMakeCache.txt found_dir REGEX "^distribute_DIR:")
  string(REGEX REPLACE "^distribute_DIR:[A-Z]+=" "" found_dir "${found_dir}")
  cmake_path(IS_PREFIX PREFIX "${found_dir}" NORMALIZE from_prefix)
  if(NOT from_prefix)
    message(FATAL_ERROR "find_package(distribute) used '${found_dir}', not the fresh prefix '${PREFIX}'")
  endif()
elseif(MODE STREQUAL "add_subdirectory")
  step("configure consumer"
    ${CMAKE_COMMAND} -S ${consumer_source} -B ${consumer_build} ${common_args}
      -DDISTRIBUTE_CONSUMER_MODE=add_subdirectory
      -DDISTRIBUTE_SOURCE_DIR=${SOURCE_DIR}
      -DDISTRIBUTE_ENABLE_CUDA=OFF)
endif()

# With the component mpi only consumer_mpi is built: the core program has its own tests.
set(programs consumer)
if("mpi" IN_LIST COMPONENTS)
  set(programs consumer_mpi)
elseif("precompiled" IN_LIST COMPONENTS)
  set(programs consumer_precompiled)
endif()
step("build ${programs}" ${CMAKE_COMMAND} --build ${consumer_build} --config ${CONFIG} --target ${programs})

# Single-config generators put a program at the top of the build dir, multi-config ones in <CONFIG>/.
function(built_program name out)
  set(exe_suffix "")
  if(CMAKE_HOST_WIN32)
    set(exe_suffix .exe)
  endif()
  set(program ${consumer_build}/${name}${exe_suffix})
  if(NOT EXISTS ${program})
    set(program ${consumer_build}/${CONFIG}/${name}${exe_suffix})
  endif()
  set(${out} ${program} PARENT_SCOPE)
endfunction()

built_program(${programs} program)
if(NOT programs STREQUAL "consumer_mpi")
  step("run ${programs}" ${program})
else()
  if(MPIEXEC)
    separate_arguments(preflags UNIX_COMMAND "${MPIEXEC_PREFLAGS}")
    step("run consumer_mpi under ${MPIEXEC}" ${MPIEXEC} -n 2 ${preflags} ${program})
  else()
    step("run consumer_mpi as one worker" ${program})
  endif()
endif()
message(STATUS "consumer test (${MODE}): passed")
