# Chapters 01 onwards — what a GPU test's exit status 77 means to CTest.
# Depends on: nothing but CMake (tests/gpu/require_gpu_check.cmake includes
# this file in a scratch project to check it).
#
# Every GPU program (tests/cuda, the GPU benchmarks' smoke runs,
# gpu_ops_dump) exits 77 when no usable GPU is there. By default CTest
# reports that as Skipped, never as Passed. With MPT_REQUIRE_GPU=ON (CI on
# a GPU machine) SKIP_RETURN_CODE is not set, so exit 77 is a failure: a
# GPU machine whose GPU is not usable cannot pass the suite by skipping it.
# The option is declared in the top-level CMakeLists.txt.

# mpt_gpu_test_skips(TEST [OPT_IN regex]): exit 77 of TEST is Skipped unless
# MPT_REQUIRE_GPU. OPT_IN: output of a deliberate skip that has nothing to
# do with the GPU being there (e.g. the 2^31-element cases, which run only
# when asked for); it stays Skipped with MPT_REQUIRE_GPU too.
function(mpt_gpu_test_skips name)
  cmake_parse_arguments(G "" "OPT_IN" "" ${ARGN})
  if(NOT MPT_REQUIRE_GPU)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  elseif(G_OPT_IN)
    set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "${G_OPT_IN}")
  endif()
endfunction()
