# Exercise kit (every chapter) — how a chapter's grader_chNN executables are
# put together. Used by the repository build (exercises/CMakeLists.txt of each
# chapter, through checks.cmake) and by every handout's own CMakeLists.txt,
# where it is grader/grader.cmake. Depends on: targets mpt::mpt and
# doctest::doctest; grader_main.cpp and grader_kit.hpp beside this file.
#
# NN below is the chapter number as two digits ("01", "02"). The test files
# are compiled once into an OBJECT library and linked into every variant
# (student file, solution, trivial stubs): a variant costs one small source
# file and a link. Including it again (a second chapter) redefines the same
# functions and is harmless.

# Where grader_main.cpp and grader_kit.hpp are: chapters/exercises/ in the
# repository, grader/ in a handout.
set(MPT_GRADER_KIT_DIR "${CMAKE_CURRENT_LIST_DIR}")

# mpt_grader_objects(NN ROOT): ROOT holds exNN.hpp and grader/ (the chapter's
# grader.hpp and test_*.cpp). Creates exNN_grader_objects (grader main and
# tests) and, when MPT_EXNN_HIDDEN_TESTS names a folder, exNN_hidden_tests
# (every *.cpp in it).
function(mpt_grader_objects NN ROOT)
  set(objects ex${NN}_grader_objects)
  file(GLOB tests CONFIGURE_DEPENDS "${ROOT}/grader/test_*.cpp")
  add_library(${objects} OBJECT "${MPT_GRADER_KIT_DIR}/grader_main.cpp" ${tests})
  target_include_directories(${objects} PUBLIC "${ROOT}" "${ROOT}/grader" "${MPT_GRADER_KIT_DIR}")
  target_link_libraries(${objects} PUBLIC mpt::mpt doctest::doctest)
  target_compile_features(${objects} PUBLIC cxx_std_17)
  target_compile_options(${objects} PRIVATE -Wall -Wextra)

  set(var MPT_EX${NN}_HIDDEN_TESTS)
  set(${var} "$ENV{${var}}" CACHE PATH
      "Folder of extra grader test files (*.cpp) compiled into every grader_ch${NN} (an instructor's hidden tests)")
  if(${var})
    get_filename_component(hidden "${${var}}" ABSOLUTE)
    if(NOT IS_DIRECTORY "${hidden}")
      message(FATAL_ERROR "${var}=${${var}} is not a folder")
    endif()
    file(GLOB hidden_tests CONFIGURE_DEPENDS "${hidden}/*.cpp")
    if(NOT hidden_tests)
      message(FATAL_ERROR "${var}=${hidden} holds no *.cpp files")
    endif()
    list(LENGTH hidden_tests n)
    message(STATUS "grader_ch${NN}: ${n} hidden test file(s) from ${hidden}")
    mpt_grader_test_objects(${NN} ex${NN}_hidden_tests ${hidden_tests})
  endif()
endfunction()

# mpt_grader_test_objects(NN NAME a.cpp ...): extra test files as an OBJECT
# library with the grader's include paths.
function(mpt_grader_test_objects NN NAME)
  add_library(${NAME} OBJECT ${ARGN})
  target_link_libraries(${NAME} PUBLIC ex${NN}_grader_objects)
  target_compile_options(${NAME} PRIVATE -Wall -Wextra)
endfunction()

# mpt_grader(NN NAME STUDENT_SOURCE [EXTRA object-libraries...]): the grader
# built against one implementation of exNN.hpp.
function(mpt_grader NN NAME STUDENT_SOURCE)
  cmake_parse_arguments(G "" "" "EXTRA" ${ARGN})
  add_executable(${NAME} "${STUDENT_SOURCE}")
  target_compile_options(${NAME} PRIVATE -Wall -Wextra)
  target_link_libraries(${NAME} PRIVATE ex${NN}_grader_objects ${G_EXTRA})
  if(TARGET ex${NN}_hidden_tests)
    target_link_libraries(${NAME} PRIVATE ex${NN}_hidden_tests)
  endif()
endfunction()

# mpt_handout_grader(NN): the whole build of a handout (its CMakeLists.txt
# calls this after project()): C++17, mpt found installed or built from a
# source tree (MPT_SOURCE_DIR), doctest, and grader_chNN built from exNN.cpp
# in the handout folder, or from MPT_EXNN_STUDENT_SOURCE (an instructor's
# submission); its test runs under MPT_GRADER_LAUNCHER when the handout
# sets one (Chapter 5: mpiexec). A macro: find_package and add_subdirectory
# must act in the handout's own scope.
macro(mpt_handout_grader NN)
  set(CMAKE_CXX_STANDARD 17)
  set(CMAKE_CXX_STANDARD_REQUIRED ON)
  set(CMAKE_CXX_EXTENSIONS OFF)
  set(MPT_SOURCE_DIR "" CACHE PATH
      "An mpt source tree to build the library from (leave empty to use an installed mpt)")
  if(MPT_SOURCE_DIR)
    # Only the library is needed: no tests, benchmarks, CUDA, docs or notebooks.
    set(MPT_TESTS OFF)
    set(MPT_BENCHMARKS OFF)
    set(MPT_CUDA OFF)
    set(MPT_DOCS OFF)
    set(MPT_NOTEBOOKS OFF)
    add_subdirectory("${MPT_SOURCE_DIR}" mpt EXCLUDE_FROM_ALL)
  else()
    find_package(mpt REQUIRED)  # e.g. -DCMAKE_PREFIX_PATH=$HOME/.local/mpt
  endif()
  find_package(doctest REQUIRED)

  mpt_grader_objects(${NN} "${CMAKE_CURRENT_SOURCE_DIR}")
  set(MPT_EX${NN}_STUDENT_SOURCE "${CMAKE_CURRENT_SOURCE_DIR}/ex${NN}.cpp" CACHE FILEPATH
      "The ex${NN}.cpp to grade (an instructor points this at a submission)")
  mpt_grader(${NN} grader_ch${NN} "${MPT_EX${NN}_STUDENT_SOURCE}")

  enable_testing()
  add_test(NAME grader_ch${NN} COMMAND ${MPT_GRADER_LAUNCHER} $<TARGET_FILE:grader_ch${NN}>)
endmacro()
