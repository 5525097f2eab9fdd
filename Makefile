# Entry points. Each installs what it needs (Debian packages, a Python environment under ~/.cache).
.PHONY: all demo check test bench dist clean

all:
	scripts/install-deps.sh
	cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
	ninja -C build

demo:
	scripts/demo.sh

# The everyday loop: release build, unit, C API and CLI tests (a few minutes warm).
check:
	scripts/check.sh

test:
	scripts/test.sh

bench:
	scripts/bench.sh

# A relocatable binary tarball: build/dist/peft_c-<version>-linux-<arch>.tar.gz (scripts/dist.sh).
dist:
	scripts/dist.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz build-clang build-aarch64 build-wheel build-consumer-subdir build-consumer-fetch
