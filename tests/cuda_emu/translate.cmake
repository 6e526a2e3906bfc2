# cuda_emu: turns one kernels/cuda/*.cu file into C++ that g++ compiles against the emulator's
# headers (include/). Four rewrites, nothing else changes (a #line keeps the original file and line
# numbers in messages):
#   reinterpret_cast<T>(x)  ->  ::cuda_emu::device_cast<T>(x)
#     (the same cast, but a pointer made in a kernel must be aligned for its element type, as a
#     GPU's vector loads and stores need: include/cuda_runtime.h)
#   kernel<<<grid, block, smem, stream>>>(args);
#     ->  ::cuda_emu::launch("kernel", &kernel, ::cuda_emu::LaunchDims(grid, block, smem, stream), [=] { kernel(args); });
#     (the address only where the launch names the instantiation: kernel<8>; a template kernel
#     deduced from its arguments has none, and the call inside the lambda deduces it as nvcc does;
#     the lambda copies the arguments, as a launch does, since a deferred stream runs it later)
#   extern __shared__ [__align__(n)] T name[];
#     ->  T* name = reinterpret_cast<T*>(::cuda_emu::dynamic_shared_memory());
#   __shared__ T name[dims];
#     ->  static thread_local T name[dims]; ::cuda_emu::shared_declared(&name, sizeof name);
#     (one copy per host thread, as the emulator runs a block on one; the first thread of each
#     block to reach it fills it with NaN bytes, as the dynamic shared memory is, so a read of
#     what no thread of this block wrote does not see the previous block's values)
# A header (kernels/cuda/*.cuh, HEADER=1) takes the first rewrite only: its static shared memory
# goes through common.cuh's GRASS_SHARED_DECLARED hook, and it launches nothing.
# Usage: cmake -DIN=file.cu -DOUT=file.cpp [-DHEADER=1] -P translate.cmake
file(READ "${IN}" text)
string(REPLACE "reinterpret_cast<" "::cuda_emu::device_cast<" text "${text}")
if(NOT HEADER)  # a header takes the cast rewrite alone
  set(ws "[ \t\r\n]*")
  string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_:]*<[^<>;]*>)${ws}<<<([^;]*)>>>\\(([^;]*)\\);"
         "::cuda_emu::launch(\"\\1\", reinterpret_cast<const void*>(&\\1), ::cuda_emu::LaunchDims(\\2), [=] { \\1(\\3); });"
         text "${text}")
  string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_:]*)${ws}<<<([^;]*)>>>\\(([^;]*)\\);"
         "::cuda_emu::launch(\"\\1\", nullptr, ::cuda_emu::LaunchDims(\\2), [=] { \\1(\\3); });" text "${text}")
  string(REGEX REPLACE "extern __shared__ (__align__\\([0-9]+\\) )?([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_]) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
         "\\2* \\3 = reinterpret_cast<\\2*>(::cuda_emu::dynamic_shared_memory());" text "${text}")
  string(REGEX REPLACE "__shared__ ([A-Za-z_][A-Za-z0-9_:]*) ([A-Za-z_][A-Za-z0-9_]*)((\\[[^;]*\\])?);"
         "static thread_local \\1 \\2\\3; ::cuda_emu::shared_declared(&\\2, sizeof \\2);" text "${text}")
  if(text MATCHES "<<<|>>>|extern __shared__|__shared__")
    message(FATAL_ERROR "cuda_emu: ${IN} has a launch or a __shared__ declaration the translation does not know")
  endif()
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
