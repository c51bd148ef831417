# Helpers that turn each folder of src/lockstep/ into one static library and
# each folder of tests/ into gtest binaries labelled fast or slow.

set(LOCKSTEP_MODULES "")
set(LOCKSTEP_ALL_LIBS "")

# lockstep_module(NAME DEPS ...): library lockstep_NAME from src/lockstep/NAME/**.cpp.
# A module with no .cpp yet becomes an INTERFACE library so dependants still link.
function(lockstep_module name)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/lockstep/${name}/*.cpp)
  if(srcs)
    add_library(lockstep_${name} STATIC ${srcs})
    target_include_directories(lockstep_${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(lockstep_${name} PUBLIC ${ARG_DEPS})
  else()
    add_library(lockstep_${name} INTERFACE)
    target_include_directories(lockstep_${name} INTERFACE ${CMAKE_SOURCE_DIR}/src)
    target_link_libraries(lockstep_${name} INTERFACE ${ARG_DEPS})
  endif()
  set(LOCKSTEP_MODULES ${LOCKSTEP_MODULES} ${name} PARENT_SCOPE)
  set(LOCKSTEP_ALL_LIBS ${LOCKSTEP_ALL_LIBS} lockstep_${name} PARENT_SCOPE)
endfunction()

# lockstep_module_tests(NAME): each tests/NAME/X_test.cpp becomes the binary
# test_NAME_X (label fast) and each tests/NAME/X_slow.cpp becomes test_NAME_X_slow
# (label slow). One binary per file keeps rebuilds small and lets work on one
# kernel proceed while another file is being edited. Shared helpers live in
# tests/common/ (header-only).
# An argument after `label`: one more environment variable for its tests, as
# NAME=set:VALUE (ctest's ENVIRONMENT_MODIFICATION; a second ENVIRONMENT entry
# would need a list, which gtest_discover_tests splits).
function(lockstep_add_test_binary target src module label)
  set(extra_env "")
  if(ARGN)
    set(extra_env ENVIRONMENT_MODIFICATION "${ARGN}")
  endif()
  add_executable(${target} ${src})
  # Every library is linked: cross-module tests (rollout vs trainer logprobs)
  # are the point of this project. Static libraries add only what is used.
  target_link_libraries(${target} PRIVATE lockstep_${module} ${LOCKSTEP_ALL_LIBS} GTest::gtest GTest::gtest_main)
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  # Keywords first: everything after PROPERTIES is read as property pairs.
  gtest_discover_tests(${target} WORKING_DIRECTORY ${CMAKE_BINARY_DIR} DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS "${label}"
                                  ENVIRONMENT "LOCKSTEP_BIN=${CMAKE_BINARY_DIR}/lockstep" ${extra_env})
endfunction()

function(lockstep_module_tests name)
  file(GLOB fast CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${name}/*_test.cpp)
  file(GLOB slow CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${name}/*_slow.cpp)
  foreach(src ${fast})
    get_filename_component(stem ${src} NAME_WE)
    string(REGEX REPLACE "_test$" "" stem ${stem})
    lockstep_add_test_binary(test_${name}_${stem} ${src} ${name} fast)
  endforeach()
  foreach(src ${slow})
    get_filename_component(stem ${src} NAME_WE)
    lockstep_add_test_binary(test_${name}_${stem} ${src} ${name} slow)
  endforeach()
endfunction()
