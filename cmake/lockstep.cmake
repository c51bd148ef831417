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

# lockstep_module_tests(NAME): tests/NAME/*_test.cpp -> test_NAME (label fast),
# tests/NAME/*_slow.cpp -> test_NAME_slow (label slow). Shared helpers live in
# tests/common/ (header-only).
function(lockstep_module_tests name)
  file(GLOB fast CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${name}/*_test.cpp)
  file(GLOB slow CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/${name}/*_slow.cpp)
  if(fast)
    add_executable(test_${name} ${fast})
    target_link_libraries(test_${name} PRIVATE lockstep_${name} GTest::gtest GTest::gtest_main)
    target_include_directories(test_${name} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    gtest_discover_tests(test_${name} PROPERTIES LABELS "fast;${name}" DISCOVERY_TIMEOUT 60
                         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  endif()
  if(slow)
    add_executable(test_${name}_slow ${slow})
    target_link_libraries(test_${name}_slow PRIVATE lockstep_${name} GTest::gtest GTest::gtest_main)
    target_include_directories(test_${name}_slow PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    gtest_discover_tests(test_${name}_slow PROPERTIES LABELS "slow;${name}" DISCOVERY_TIMEOUT 60
                         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  endif()
endfunction()
