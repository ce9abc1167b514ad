# Chapter 01 exercises — how grader_ch01 executables are put together. Used by
# the repository build (exercises/CMakeLists.txt) and by the handout's own
# CMakeLists.txt. Depends on: targets mpt::mpt and doctest::doctest.
#
# The test files are compiled once into an OBJECT library and linked into
# every variant (student file, solution, trivial stubs): a variant costs one
# small source file and a link.

set(MPT_EX01_HIDDEN_TESTS "$ENV{MPT_EX01_HIDDEN_TESTS}" CACHE PATH
    "Folder of extra grader test files (*.cpp) compiled into every grader_ch01 (an instructor's hidden tests)")

# mpt_ex01_grader_objects(ROOT): ROOT holds ex01.hpp and grader/. Creates
# ex01_grader_objects (grader main and tests) and, when MPT_EX01_HIDDEN_TESTS
# names a folder, ex01_hidden_tests (every *.cpp in it).
function(mpt_ex01_grader_objects ROOT)
  file(GLOB tests CONFIGURE_DEPENDS "${ROOT}/grader/test_*.cpp")
  add_library(ex01_grader_objects OBJECT "${ROOT}/grader/grader_main.cpp" ${tests})
  target_include_directories(ex01_grader_objects PUBLIC "${ROOT}" "${ROOT}/grader")
  target_link_libraries(ex01_grader_objects PUBLIC mpt::mpt doctest::doctest)
  target_compile_features(ex01_grader_objects PUBLIC cxx_std_17)
  target_compile_options(ex01_grader_objects PRIVATE -Wall -Wextra)

  if(MPT_EX01_HIDDEN_TESTS)
    get_filename_component(hidden "${MPT_EX01_HIDDEN_TESTS}" ABSOLUTE)
    if(NOT IS_DIRECTORY "${hidden}")
      message(FATAL_ERROR "MPT_EX01_HIDDEN_TESTS=${MPT_EX01_HIDDEN_TESTS} is not a folder")
    endif()
    file(GLOB hidden_tests CONFIGURE_DEPENDS "${hidden}/*.cpp")
    if(NOT hidden_tests)
      message(FATAL_ERROR "MPT_EX01_HIDDEN_TESTS=${hidden} holds no *.cpp files")
    endif()
    list(LENGTH hidden_tests n)
    message(STATUS "grader_ch01: ${n} hidden test file(s) from ${hidden}")
    mpt_ex01_test_objects(ex01_hidden_tests ${hidden_tests})
  endif()
endfunction()

# mpt_ex01_test_objects(NAME a.cpp ...): extra test files as an OBJECT
# library with the grader's include paths.
function(mpt_ex01_test_objects NAME)
  add_library(${NAME} OBJECT ${ARGN})
  target_link_libraries(${NAME} PUBLIC ex01_grader_objects)
  target_compile_options(${NAME} PRIVATE -Wall -Wextra)
endfunction()

# mpt_ex01_grader(NAME STUDENT_SOURCE [EXTRA object-libraries...]): the
# grader built against one implementation of ex01.hpp.
function(mpt_ex01_grader NAME STUDENT_SOURCE)
  cmake_parse_arguments(G "" "" "EXTRA" ${ARGN})
  add_executable(${NAME} "${STUDENT_SOURCE}")
  target_compile_options(${NAME} PRIVATE -Wall -Wextra)
  target_link_libraries(${NAME} PRIVATE ex01_grader_objects ${G_EXTRA})
  if(TARGET ex01_hidden_tests)
    target_link_libraries(${NAME} PRIVATE ex01_hidden_tests)
  endif()
endfunction()
