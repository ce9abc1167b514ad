# All chapters — configures, builds and runs tests/install/consumer against
# an installed mpt (the fixture mpt_installed: install_prefix.cmake). Invoked
# by CTest with -DPREFIX, -DSOURCE_DIR, -DWORK_DIR, and the main build's
# compiler and flags (CONSUMER_CXX, CONSUMER_CXX_FLAGS), so that a sanitizer
# build's static library links into the consumer.
file(REMOVE_RECURSE "${WORK_DIR}")
file(GLOB_RECURSE config "${PREFIX}/mptConfig.cmake")
if(NOT config)
  message(FATAL_ERROR "no installed mpt in ${PREFIX} (the test install_scratch_prefix puts it there)")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/consumer" -B "${WORK_DIR}/build"
                        -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_TYPE=Release
                        "-DCMAKE_CXX_COMPILER=${CONSUMER_CXX}" "-DCMAKE_CXX_FLAGS=${CONSUMER_CXX_FLAGS}"
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer with find_package(mpt) failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/build" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed (${rc})")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer program failed (${rc})")
endif()
