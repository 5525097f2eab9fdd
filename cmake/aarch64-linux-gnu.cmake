# Cross-compiles for aarch64 Linux with Debian's cross compilers (g++-aarch64-linux-gnu) against
# the arm64 libraries installed through multiarch (libopenblas-dev:arm64, libpcre2-dev:arm64); the
# header-only dependencies (nlohmann-json, xtensor, xtensor-blas, doctest) are the host's. CTest
# runs the test programs under qemu-user. scripts/test-aarch64.sh installs all of this and uses it:
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The cross toolchain's own C and C++ runtime lives in /usr/aarch64-linux-gnu/lib, the multiarch
# libraries in /usr/lib/aarch64-linux-gnu.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu
    -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib:/usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config (PCRE2) must see the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# Debian installs the CMake packages of the header-only xtensor and xtensor-blas under the host's
# multiarch folder; they hold no binaries, so the host's serve the target.
list(APPEND CMAKE_PREFIX_PATH /usr/lib/${CMAKE_HOST_SYSTEM_PROCESSOR}-linux-gnu/cmake)
