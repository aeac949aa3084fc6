# example.conditional_gan_resume: a run stopped after 6 of 10 steps and resumed from its checkpoint
# draws the same samples, bit for bit, as the run of 10 steps without a stop (the generator after
# the last step, which the discriminator's states and the random engine restored have shaped too).
# cmake -DPROGRAM=<conditional_gan> -DWORK=<dir> -P resume_check.cmake
file(REMOVE_RECURSE "${WORK}")
set(common --steps 10 --batch 16 --log-every 5)
function(run what)
  execute_process(COMMAND "${PROGRAM}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} exited ${rc}:\n${out}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()
run("the uninterrupted run" ${common} --checkpoint-dir "${WORK}/whole/ck" --out "${WORK}/whole/out")
run("the first 6 steps" --steps 6 --batch 16 --log-every 5 --checkpoint-dir "${WORK}/parts/ck" --checkpoint-every 3
    --out "${WORK}/parts/out")
file(REMOVE "${WORK}/parts/out/samples.png")
run("the resumed run" ${common} --checkpoint-dir "${WORK}/parts/ck" --resume --out "${WORK}/parts/out")
if(NOT run_output MATCHES "resumed from [^\n]* at step 6")
  message(FATAL_ERROR "the second run did not resume at step 6:\n${run_output}")
endif()
file(SHA256 "${WORK}/whole/out/samples.png" whole)
file(SHA256 "${WORK}/parts/out/samples.png" parts)
if(NOT whole STREQUAL parts)
  message(FATAL_ERROR "resumed at step 6, the samples after 10 steps differ from the uninterrupted run's")
endif()
message(STATUS "stopped at 6 of 10 steps and resumed: the same samples as without the stop (${whole})")
