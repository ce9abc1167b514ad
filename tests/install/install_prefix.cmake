# All chapters — the tests' one install of the build (the CTest fixture
# mpt_installed): `cmake --install BUILD_DIR --prefix PREFIX` into a fresh
# PREFIX. The consumer check and every chapter's handout check build against
# it. Invoked by CTest with -DBUILD_DIR and -DPREFIX.
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed (${rc})")
endif()
