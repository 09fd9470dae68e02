# Checks that instructions beyond the portable baseline appear only in the
# kernel variants compiled for them, so a binary built on an AVX-512 host
# cannot die of SIGILL on an AVX2-only or older machine (ctest runs this).
#
#   cmake -DOBJECTS="a.o|b.o" -DOBJDUMP=objdump -DNM=nm -DNATIVE=OFF -P check_kernel_isa.cmake
#
# *_avx512bf16.cpp.o, *_avx512.cpp.o  anything goes.
# *_avx2.cpp.o    no AVX-512: no zmm, no mask registers, no xmm/ymm16-31 (EVEX).
# every other     no VEX or EVEX at all (x86-64-v2), unless TROUPE_NATIVE=ON.
# Variant objects must not define a weak (inline or template) symbol outside
# their own namespace: the linker keeps one copy of such a symbol for every
# caller, and it could be the AVX-512 one.
string(REPLACE "|" ";" objects "${OBJECTS}")
set(failures "")
set(checked 0)
foreach(obj IN LISTS objects)
  get_filename_component(name "${obj}" NAME)
  set(kind baseline)
  if(name MATCHES "_avx512bf16\\.cpp\\.o$")
    set(kind avx512bf16)
  elseif(name MATCHES "_avx512\\.cpp\\.o$")
    set(kind avx512)
  elseif(name MATCHES "_avx2\\.cpp\\.o$")
    set(kind avx2)
  elseif(name MATCHES "_portable\\.cpp\\.o$")
    set(kind portable)
  endif()
  if(kind STREQUAL "baseline" AND NATIVE)
    continue()
  endif()
  if(NOT kind MATCHES "^avx512")
    execute_process(COMMAND "${OBJDUMP}" -d --no-show-raw-insn "${obj}" OUTPUT_VARIABLE asm RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${OBJDUMP} failed on ${obj}")
    endif()
    if(kind STREQUAL "avx2")
      if(asm MATCHES "zmm|%k[0-7][,)]|mm(1[6-9]|2[0-9]|3[01])")
        list(APPEND failures "${name}: AVX-512 instruction in the AVX2 variant")
      endif()
    elseif(asm MATCHES ":\tv[a-z]|ymm|zmm")
      list(APPEND failures "${name}: AVX instruction outside the AVX2/AVX-512 variants")
    endif()
  endif()
  if(NOT kind STREQUAL "baseline")
    execute_process(COMMAND "${NM}" -C --defined-only "${obj}" OUTPUT_VARIABLE syms)
    string(REPLACE "\n" ";" lines "${syms}")
    foreach(line IN LISTS lines)
      if(line MATCHES "^[0-9a-f]+ [WVu] (.*)$" AND NOT CMAKE_MATCH_1 MATCHES "::${kind}::")
        list(APPEND failures "${name}: weak symbol shared with other objects: ${CMAKE_MATCH_1}")
      endif()
    endforeach()
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "kernel ISA isolation broken:\n  ${text}")
endif()
message(STATUS "kernel ISA isolation: ${checked} objects checked")
