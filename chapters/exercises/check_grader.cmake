# Exercise kit (every chapter) — CI's proof that a grader grades: runs one
# grader variant and checks its printed score. Depends on: nothing but CMake.
# Used by checks.cmake and check_handout.sh; never shipped.

#   cmake -DGRADER=exe -DEXPECT=none|full|below|partial|naive [-DARGS=a;b]
#         [-DONLY=1.2] [-DNOT_IMPLEMENTED=ON] [-DREQUIRE_REGEX=re]
#         [-DLAUNCHER=mpiexec|-n|2] [-DSCORES=2.1=7/22|2.2=8/25] -P check_grader.cmake
# none: 0 points for every exercise; full: all points; below: less than full
# for every exercise; partial: more than 0 and less than full for every
# exercise; naive: more than 0 and at most a third of the points for every
# exercise (a near miss: the naive answer scores something, never a pass). A crash, a missing executable or a missing "total:" line fails
# the check whatever was expected: only a printed score counts.
# NOT_IMPLEMENTED (with none, for the stubs): every write exercise shows its
# stub's "exercise N.M not implemented"; a diagnose exercise (its title
# starts "diagnose: ") ships a broken body that runs, so it must score 0
# without that message: the shipped bug fails every one of its test cases.
# SCORES ('|' between them): exact scores this variant must print, so that a
# change of weights or of what a near miss passes shows in CI.
# LAUNCHER ('|' between its words): the command the grader runs under
# (Chapter 5's graders run under mpiexec; rank 0 alone prints).
foreach(v GRADER EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_grader.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${GRADER}")
  message(FATAL_ERROR "grader executable ${GRADER} does not exist (did the build fail?)")
endif()

string(REPLACE "|" ";" launcher "${LAUNCHER}")
execute_process(COMMAND ${launcher} "${GRADER}" ${ARGS}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}")
if(err)
  message("stderr:\n${err}")
endif()

set(problems "")
if(NOT rc MATCHES "^[0-9]+$")
  list(APPEND problems "the grader did not exit normally: ${rc}")
endif()
if(NOT out MATCHES "\ntotal: ([0-9]+)/([0-9]+) points")
  list(APPEND problems "no 'total: N/M points' line (crash or early exit)")
endif()
set(total ${CMAKE_MATCH_1})
set(total_max ${CMAKE_MATCH_2})

# Per-exercise lines: "exercise 1.2 (title): 3/3 points  [a stub's message]"
string(REGEX MATCHALL "\nexercise [0-9]+\\.[0-9]+ [^\n]*: [0-9]+/[0-9]+ points[^\n]*" lines "${out}")
set(seen "")
foreach(line IN LISTS lines)
  string(REGEX MATCH "exercise ([0-9]+\\.[0-9]+) .*: ([0-9]+)/([0-9]+) points" _ "${line}")
  set(id ${CMAKE_MATCH_1})
  set(got ${CMAKE_MATCH_2})
  set(max ${CMAKE_MATCH_3})
  list(APPEND seen ${id})
  string(REPLACE "|" ";" pinned "${SCORES}")
  foreach(pin IN LISTS pinned)
    string(REGEX MATCH "^([0-9]+\\.[0-9]+)=([0-9]+/[0-9]+)$" _ "${pin}")
    if(CMAKE_MATCH_1 STREQUAL "${id}" AND NOT "${got}/${max}" STREQUAL "${CMAKE_MATCH_2}")
      list(APPEND problems "exercise ${id}: ${got}/${max}, pinned at ${CMAKE_MATCH_2} (SCORES)")
    endif()
  endforeach()
  if(max EQUAL 0)
    list(APPEND problems "exercise ${id} ran no test case")
  elseif(EXPECT STREQUAL "none" AND NOT got EQUAL 0)
    list(APPEND problems "exercise ${id}: ${got}/${max}, expected 0 points")
  elseif(EXPECT STREQUAL "full" AND NOT got EQUAL max)
    list(APPEND problems "exercise ${id}: ${got}/${max}, expected full points")
  elseif(EXPECT STREQUAL "below" AND NOT got LESS max)
    list(APPEND problems "exercise ${id}: ${got}/${max}, expected less than full points")
  elseif(EXPECT STREQUAL "partial" AND (got EQUAL 0 OR NOT got LESS max))
    list(APPEND problems "exercise ${id}: ${got}/${max}, expected some points but not all")
  elseif(EXPECT STREQUAL "naive")
    math(EXPR thrice "${got} * 3")
    if(got EQUAL 0 OR thrice GREATER max)
      list(APPEND problems "exercise ${id}: ${got}/${max}, expected more than 0 and at most a third")
    endif()
  endif()
  if(NOT_IMPLEMENTED AND line MATCHES "exercise ${id} \\(diagnose: ")
    if(line MATCHES "not implemented")
      list(APPEND problems "exercise ${id} is a diagnose exercise: its shipped body must run, not throw")
    endif()
  elseif(NOT_IMPLEMENTED AND NOT line MATCHES "exercise ${id} not implemented")
    list(APPEND problems "exercise ${id}: the stub's message 'exercise ${id} not implemented' is missing")
  endif()
endforeach()

string(REPLACE "|" ";" pinned "${SCORES}")
foreach(pin IN LISTS pinned)
  if(NOT pin MATCHES "^([0-9]+\\.[0-9]+)=[0-9]+/[0-9]+$")
    list(APPEND problems "SCORES entry '${pin}' is not ID=GOT/MAX")
  else()
    list(FIND seen "${CMAKE_MATCH_1}" at)
    if(at EQUAL -1)
      list(APPEND problems "SCORES pins exercise ${CMAKE_MATCH_1}, which was not scored")
    endif()
  endif()
endforeach()
if(ONLY)
  if(NOT seen STREQUAL "${ONLY}")
    list(APPEND problems "expected only exercise(s) ${ONLY} to run, saw: ${seen}")
  endif()
elseif(NOT seen)
  list(APPEND problems "no exercise was scored")
endif()

if(EXPECT STREQUAL "full")
  if(NOT rc EQUAL 0)
    list(APPEND problems "full points but exit status ${rc}, expected 0")
  endif()
elseif(rc EQUAL 0)
  list(APPEND problems "exit status 0 without full points; expected non-zero")
endif()
if(REQUIRE_REGEX AND NOT out MATCHES "${REQUIRE_REGEX}")
  list(APPEND problems "output does not match '${REQUIRE_REGEX}'")
endif()

if(problems)
  list(JOIN problems "\n  " msg)
  message(FATAL_ERROR "grader check failed (${GRADER} ${ARGS}, expected ${EXPECT}):\n  ${msg}")
endif()
message(STATUS "grader check ok: ${EXPECT}, total ${total}/${total_max}")
