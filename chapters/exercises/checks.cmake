# Exercise kit (every chapter) — the repository build of one chapter's
# exercises: graders built from every implementation the chapter keeps, and
# the CTest checks that prove the grader grades, both ways. Depends on:
# grader.cmake, check_grader.cmake and check_handout.sh beside this file,
# doctest, mpt; included by chapters/NN-*/exercises/CMakeLists.txt.
#
#   mpt_exercise_checks(NN
#     EXERCISES 2.1 2.2 2.3            the ids, in order (for the error check)
#     ONE 2.2                          an id to grade alone
#     [HIDDEN_EXAMPLE file.cpp HIDDEN_REGEX regex]
#     [LINK target...]                 more libraries for the graders (mpt::dist_mpi)
#     [LAUNCHER cmd...]                how every grader is run (mpiexec -n 2 ...)
#     [PROCESSORS n] [TIMEOUT s]       CTest's properties of every grader run
#     [NAIVE_AT_MOST_THIRD]            the near misses score at most a third, each exercise
#     [SCORES variant:id=got/max ...]) each score pinned exactly: variant is near_misses
#                                      or trivial_<name> (a re-weighting shows in CI)
#
# The chapter folder must hold exNN.hpp, student/exNN.cpp (the stubs and
# the diagnose exercises' broken bodies),
# solution/exNN.cpp, near-misses/exNN.cpp, trivial/*.cpp and grader/. Every
# test is labelled "chNN;exercise":
#   exercise_chNN_stubs_score_zero        0 points everywhere, each write exercise "not
#                                         implemented", each diagnose exercise's shipped bug run
#   exercise_chNN_solution_full_marks     full points, exit 0
#   exercise_chNN_trivial_<name>_fails    below full points in every exercise
#   exercise_chNN_near_misses_partial     some points but not all, in every exercise;
#                                         with NAIVE_AT_MOST_THIRD, some points but at most
#                                         a third of each exercise's (the naive answer of
#                                         the pitfall an exercise teaches must not pass)
#   exercise_chNN_one_exercise            --exercise=ONE scores only ONE
#   exercise_chNN_unknown_exercise        --exercise 9.9 names the valid ids
#   exercise_chNN_hidden_tests_counted    (with HIDDEN_EXAMPLE) hidden tests scored
#   exercise_chNN_handout                 the handout, built against an installed mpt
find_package(doctest REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/grader.cmake)
set(MPT_EXERCISE_KIT_CHECKS_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(mpt_exercise_checks NN)
  cmake_parse_arguments(C "NAIVE_AT_MOST_THIRD" "ONE;HIDDEN_EXAMPLE;HIDDEN_REGEX;PROCESSORS;TIMEOUT" "EXERCISES;LINK;LAUNCHER;SCORES" ${ARGN})
  set(ex ${CMAKE_CURRENT_SOURCE_DIR})
  set(kit ${MPT_EXERCISE_KIT_CHECKS_DIR})
  set(ch ch${NN})
  mpt_grader_objects(${NN} ${ex})
  if(C_LINK)
    target_link_libraries(ex${NN}_grader_objects PUBLIC ${C_LINK})
  endif()
  # A launcher travels to check_grader.cmake as one argument: '|' for ';'.
  string(REPLACE ";" "|" launcher "${C_LAUNCHER}")
  if(NOT C_PROCESSORS)
    set(C_PROCESSORS 1)
  endif()
  if(NOT C_TIMEOUT)
    set(C_TIMEOUT 300)
  endif()

  mpt_grader(${NN} grader_${ch}_stubs ${ex}/student/ex${NN}.cpp)
  mpt_grader(${NN} grader_${ch}_solution ${ex}/solution/ex${NN}.cpp)
  mpt_grader(${NN} grader_${ch}_near_misses ${ex}/near-misses/ex${NN}.cpp)
  file(GLOB trivial CONFIGURE_DEPENDS ${ex}/trivial/*.cpp)
  set(variants "")
  foreach(f IN LISTS trivial)
    get_filename_component(variant ${f} NAME_WE)
    list(APPEND variants ${variant})
    mpt_grader(${NN} grader_${ch}_trivial_${variant} ${f})
  endforeach()
  if(C_HIDDEN_EXAMPLE)
    # The hidden-test mechanism, proved with an example file of hidden tests.
    mpt_grader_test_objects(${NN} ex${NN}_hidden_example ${C_HIDDEN_EXAMPLE})
    mpt_grader(${NN} grader_${ch}_hidden_example ${ex}/solution/ex${NN}.cpp EXTRA ex${NN}_hidden_example)
  endif()

  # Grade any file in the repository build: -DMPT_EXNN_STUDENT_SOURCE=path/exNN.cpp
  # gives a target grader_chNN (the handout is the usual way; see INSTRUCTORS.md).
  set(MPT_EX${NN}_STUDENT_SOURCE "" CACHE FILEPATH "A student's ex${NN}.cpp to build grader_${ch} from")
  if(MPT_EX${NN}_STUDENT_SOURCE)
    mpt_grader(${NN} grader_${ch} ${MPT_EX${NN}_STUDENT_SOURCE})
  endif()

  add_custom_target(handout_${ch}
    COMMAND bash ${PROJECT_SOURCE_DIR}/tools/make_handout.sh --force ${NN} ${PROJECT_BINARY_DIR}/handout/${ch}
    COMMENT "Student handout for Chapter ${NN} in ${PROJECT_BINARY_DIR}/handout/${ch}"
    VERBATIM)

  # --- the grader, checked both ways -----------------------------------------
  set(labels "${ch};exercise")
  # A grader run takes under a second (a chapter that runs it under
  # mpiexec gives its own TIMEOUT); 300 s. A handout check builds the
  # handout twice (about 25 s here); 600 s.
  # The pinned scores of one variant (SCORES), '|' between them.
  function(_mpt_pinned VARIANT OUT)
    set(pins "")
    foreach(s IN LISTS C_SCORES)
      if(s MATCHES "^${VARIANT}:(.+)$")
        list(APPEND pins "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    string(REPLACE ";" "|" pins "${pins}")
    set(${OUT} "${pins}" PARENT_SCOPE)
  endfunction()
  function(_mpt_exercise_check NAME GRADER EXPECT)
    string(REGEX REPLACE "^grader_${ch}_" "" variant "${GRADER}")
    _mpt_pinned(${variant} pins)
    add_test(NAME ${NAME}
      COMMAND ${CMAKE_COMMAND} -DGRADER=$<TARGET_FILE:${GRADER}> -DEXPECT=${EXPECT} ${ARGN}
              "-DLAUNCHER=${launcher}" "-DSCORES=${pins}" -P ${kit}/check_grader.cmake)
    set_tests_properties(${NAME} PROPERTIES LABELS "${labels}" TIMEOUT ${C_TIMEOUT} PROCESSORS ${C_PROCESSORS})
  endfunction()

  _mpt_exercise_check(exercise_${ch}_stubs_score_zero grader_${ch}_stubs none -DNOT_IMPLEMENTED=ON)
  _mpt_exercise_check(exercise_${ch}_solution_full_marks grader_${ch}_solution full)
  foreach(variant IN LISTS variants)
    _mpt_exercise_check(exercise_${ch}_trivial_${variant}_fails grader_${ch}_trivial_${variant} below)
  endforeach()
  if(C_NAIVE_AT_MOST_THIRD)
    _mpt_exercise_check(exercise_${ch}_near_misses_partial grader_${ch}_near_misses naive)
  else()
    _mpt_exercise_check(exercise_${ch}_near_misses_partial grader_${ch}_near_misses partial)
  endif()
  _mpt_exercise_check(exercise_${ch}_one_exercise grader_${ch}_solution full -DARGS=--exercise=${C_ONE} -DONLY=${C_ONE})
  if(C_HIDDEN_EXAMPLE)
    _mpt_exercise_check(exercise_${ch}_hidden_tests_counted grader_${ch}_hidden_example full "-DREQUIRE_REGEX=${C_HIDDEN_REGEX}")
  endif()

  list(JOIN C_EXERCISES ", " valid)
  string(REPLACE "." "\\." valid_re "${valid}")
  add_test(NAME exercise_${ch}_unknown_exercise COMMAND ${C_LAUNCHER} $<TARGET_FILE:grader_${ch}_solution> --exercise 9.9)
  set_tests_properties(exercise_${ch}_unknown_exercise PROPERTIES LABELS "${labels}"
    TIMEOUT ${C_TIMEOUT} PROCESSORS ${C_PROCESSORS} PASS_REGULAR_EXPRESSION "unknown exercise '9\\.9'; valid: ${valid_re}\n")

  # The handout: made by the tool, free of solution code, and building on its
  # own against an installed mpt (the tests' one install, fixture
  # mpt_installed). The same compiler and flags as this build, so that e.g. a
  # sanitizer build of the library still links.
  add_test(NAME exercise_${ch}_handout
    COMMAND bash ${kit}/check_handout.sh ${NN}
            ${PROJECT_SOURCE_DIR} ${MPT_SCRATCH_PREFIX} ${CMAKE_CURRENT_BINARY_DIR}/handout-check
            -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} "-DCMAKE_CXX_FLAGS=${CMAKE_CXX_FLAGS}"
            -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE})
  set_tests_properties(exercise_${ch}_handout PROPERTIES LABELS "${labels};install" TIMEOUT 600
    FIXTURES_REQUIRED mpt_installed ENVIRONMENT "MPT_GRADER_LAUNCHER=${launcher}")
endfunction()
