# Runs two builds of one program and requires the same exit status and output.
#
#   cmake -DFIRST=<program> -DSECOND=<program> -P compare_outputs.cmake
foreach(which IN ITEMS FIRST SECOND)
  execute_process(COMMAND ${${which}} RESULT_VARIABLE rc_${which} OUTPUT_VARIABLE out_${which} ERROR_VARIABLE err_${which})
  if(NOT rc_${which} EQUAL 0)
    message(FATAL_ERROR "${${which}} failed (${rc_${which}}):\n${out_${which}}${err_${which}}")
  endif()
endforeach()
if(NOT out_FIRST STREQUAL out_SECOND)
  message(FATAL_ERROR "the builds disagree:\n${FIRST}: ${out_FIRST}\n${SECOND}: ${out_SECOND}")
endif()
message(STATUS "both builds print: ${out_FIRST}")
