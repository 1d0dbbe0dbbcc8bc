# rollout/client_links_alone.cmake: the C++ client stands alone (issue 13, item 5).
# Run by ctest (rollout_client_links_alone): cmake -DEXE=<client_example> -DZMQ=<libzmq.so> -P this.
# Fails if `ldd EXE` lists a shared library outside the allowed set: what `ldd libzmq.so` lists
# (libzmq's own dependencies, whatever this distribution builds it with), libzmq itself, the C and
# C++ runtime (libc, libm, libstdc++, libgcc_s, the loader, the vDSO) and libflatbuffers (allowed,
# though the C++ FlatBuffers here are header-only). In particular: no liblmdb, libseccomp, spdlog,
# fmt, xxhash or engine code.
cmake_minimum_required(VERSION 3.25)
foreach(v EXE ZMQ)
  if(NOT DEFINED ${v} OR NOT EXISTS "${${v}}")
    message(FATAL_ERROR "client_links_alone: ${v}='${${v}}' does not exist")
  endif()
endforeach()

# The sonames (the word before "=>", or the path's file name) that `ldd FILE` lists.
function(ldd_names file out)
  execute_process(COMMAND ldd "${file}" OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "client_links_alone: ldd ${file} failed (${rc})")
  endif()
  string(REPLACE "\n" ";" lines "${text}")
  set(names "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line STREQUAL "")
      continue()
    endif()
    string(REGEX REPLACE "[ \t].*$" "" first "${line}")
    get_filename_component(name "${first}" NAME)
    list(APPEND names "${name}")
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

ldd_names("${ZMQ}" zmq_deps)
ldd_names("${EXE}" exe_deps)
set(allowed ${zmq_deps})
set(runtime_patterns "^libzmq\\.so" "^libc\\.so" "^libm\\.so" "^libstdc\\+\\+\\.so" "^libgcc_s\\.so"
    "^ld-linux" "^linux-vdso\\.so" "^linux-gate\\.so" "^libflatbuffers\\.so")
set(bad "")
foreach(name IN LISTS exe_deps)
  if(name IN_LIST allowed)
    continue()
  endif()
  set(ok FALSE)
  foreach(p IN LISTS runtime_patterns)
    if(name MATCHES "${p}")
      set(ok TRUE)
    endif()
  endforeach()
  if(NOT ok)
    list(APPEND bad "${name}")
  endif()
endforeach()
message(STATUS "client_example links: ${exe_deps}")
message(STATUS "allowed beyond the runtime (ldd libzmq): ${zmq_deps}")
if(bad)
  message(FATAL_ERROR "client_links_alone: client_example links what the client must not need: "
                      "${bad}")
endif()

# Static code is invisible to ldd: no symbol of the engine, the WAL, the sandbox or the kernels
# may be defined in the executable either.
find_program(NM nm)
if(NM)
  execute_process(COMMAND "${NM}" -C --defined-only "${EXE}"
                  OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND syms MATCHES "bitroll::(engine|wal|sandbox|kernels)::[A-Za-z0-9_:]*")
    message(FATAL_ERROR "client_links_alone: client_example holds module code: ${CMAKE_MATCH_0}")
  endif()
endif()
