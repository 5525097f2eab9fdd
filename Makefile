# Entry points. Each installs what it needs (Debian packages, a Python environment under ~/.cache).
.PHONY: all demo test bench clean

all:
	scripts/install-deps.sh
	cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
	ninja -C build

demo:
	scripts/demo.sh

test:
	scripts/test.sh

bench:
	scripts/bench.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz build-clang build-aarch64
