# An example's resume, checked: a run stopped after STOP of STEPS steps and run again from its
# checkpoint draws the same picture, bit for bit, as the run of STEPS steps without a stop (the
# networks after the last step, which the optimisers' states and the random engine restored have
# shaped too). Used by example.conditional_gan_resume, whose first run is --steps STOP, and by
# example.pix2pix_resume, whose learning rate decays over --steps: a run stopped by a smaller --steps
# would train on another schedule, so its first run keeps --steps STEPS and stops with STOP_FLAG STOP
# (pix2pix's --stop-at), as a preempted run does.
#
#   cmake -DPROGRAM=<example> -DWORK=<dir> -DSTEPS=10 -DSTOP=6 -DPICTURE=samples.png
#         [-DARGS="<more flags>"] [-DRESUME_ARGS="--resume"] [-DSTOP_FLAG=--stop-at] -P resume_check.cmake
#
# The program takes --steps N, --checkpoint-dir DIR (with a checkpoint at the end of a run) and
# --out DIR (where it writes PICTURE). A program that exits 77 (no data set) makes the check print
# "resume_check: skipped", which the tests' SKIP_REGULAR_EXPRESSION reports as skipped.
foreach(required IN ITEMS PROGRAM WORK STEPS STOP PICTURE)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "resume_check.cmake needs -D${required}=...")
  endif()
endforeach()
separate_arguments(args UNIX_COMMAND "${ARGS}")
separate_arguments(resume_args UNIX_COMMAND "${RESUME_ARGS}")
file(REMOVE_RECURSE "${WORK}")
function(run what)
  execute_process(COMMAND "${PROGRAM}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 77)
    message(STATUS "resume_check: skipped (${what} exited 77: ${out})")
    set(skipped TRUE PARENT_SCOPE)
    return()
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} exited ${rc}:\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
run("the uninterrupted run" --steps ${STEPS} ${args} --checkpoint-dir "${WORK}/whole/ck" --out "${WORK}/whole/out")
if(skipped)
  return()
endif()
if(DEFINED STOP_FLAG)
  set(first_steps --steps ${STEPS} ${STOP_FLAG} ${STOP})
else()
  set(first_steps --steps ${STOP})
endif()
run("the first ${STOP} steps" ${first_steps} ${args} --checkpoint-dir "${WORK}/parts/ck" --out "${WORK}/parts/out")
file(REMOVE "${WORK}/parts/out/${PICTURE}")
run("the resumed run" --steps ${STEPS} ${args} ${resume_args} --checkpoint-dir "${WORK}/parts/ck" --out
    "${WORK}/parts/out")
if(NOT run_output MATCHES "resumed from [^\n]* at step ${STOP}")
  message(FATAL_ERROR "the second run did not resume at step ${STOP}:\n${run_output}")
endif()
file(SHA256 "${WORK}/whole/out/${PICTURE}" whole)
file(SHA256 "${WORK}/parts/out/${PICTURE}" parts)
if(NOT whole STREQUAL parts)
  message(FATAL_ERROR "resumed at step ${STOP}, ${PICTURE} after ${STEPS} steps differs from the uninterrupted run's")
endif()
message(STATUS "stopped at ${STOP} of ${STEPS} steps and resumed: the same ${PICTURE} as without the stop (${whole})")
