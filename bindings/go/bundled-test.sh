#!/usr/bin/env bash
# The Go binding without an installed library: a fresh module outside the repository requires
# github.com/peft-c/peft_c (a `replace` to a copy of the module's files only: what `go get` would
# download), builds examples/go/quickstart with `go build -tags peftc_bundled` (cgo compiles the C++
# sources itself; pkg-config is made unusable), checks that the program does not load libpeft_c, runs
# it on the fixtures and compares its merged model byte for byte with `peftc merge` (PEFTC).
# scripts/test.sh runs it from the repository root. The module copy and the program's module live at
# fixed paths under ~/.cache/peft_c/go-bundled and Go's build cache persists. Go's cache does not see
# the .cpp files the wrappers include, so CGO_LDFLAGS carries their checksum (a search path that does
# not exist): Go's key for the package includes its linker flags, so a change of the sources rebuilds
# it, while ccache, which never sees the linker flags, still serves every file that did not change
# (a new checksum with no file changed: 253 s when ccache missed every file, 24 s now on 2 cores).
# Exits nonzero on any failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
peftc=${PEFTC:-$root/build/peftc}
go=$(command -v go || echo /usr/local/go/bin/go)

cache=${XDG_CACHE_HOME:-$HOME/.cache}/peft_c
work=$cache/go-bundled
export GOPATH=$cache/go/gopath GOMODCACHE=$cache/go/gopath/pkg/mod GOCACHE=$cache/go/build
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=1
export PKG_CONFIG=false   # the bundled build must not ask pkg-config for anything
unset PKG_CONFIG_PATH
if command -v ccache >/dev/null; then
  export CC="ccache gcc" CXX="ccache g++"
  # Go names each compile's random seed after the package's key and maps its random work folder in
  # the file names: neither changes what these sources compile to, so ccache leaves them out of its key.
  export CCACHE_IGNOREOPTIONS="-frandom-seed=* -ffile-prefix-map=* -fdebug-prefix-map=*"
fi
sources=$(cd "$root" && git ls-files --cached --others --exclude-standard -- src include data | LC_ALL=C sort |
  xargs sha256sum | sha256sum | cut -c1-16)
export CGO_LDFLAGS="-L$work/sources-$sources"

# The module: the repository's files (tracked or new, not ignored), without the nested examples module.
rm -rf "$work/module" "$work/app" "$work/out"
mkdir -p "$work/module" "$work/app"
(cd "$root" && git ls-files --cached --others --exclude-standard | grep -v '^examples/go/' |
  while read -r f; do [ -f "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$work/module")
cp "$root/examples/go/quickstart/main.go" "$work/app/main.go"
cat > "$work/app/go.mod" <<MOD
module example.com/quickstart

go 1.24

require github.com/peft-c/peft_c v0.0.0

replace github.com/peft-c/peft_c => ../module
MOD

start=$SECONDS
(cd "$work/app" && "$go" build -tags peftc_bundled -o quickstart .)
echo "   go build -tags peftc_bundled: $((SECONDS - start)) s"
if ldd "$work/app/quickstart" | grep -q libpeft_c; then
  echo "the bundled program loads libpeft_c:"; ldd "$work/app/quickstart"; exit 1
fi

base=$root/tests/fixtures/models/llama adapter=$root/tests/fixtures/adapters/llama_lora
# No library path: the program must run on its own (the translation tables come from the module copy).
env -u LD_LIBRARY_PATH -u PEFT_C_DATA_DIR "$work/app/quickstart" "$base" "$adapter" "$work/out/quickstart"
"$peftc" merge --base "$base" --adapter "$adapter" --out "$work/out/peftc" >/dev/null
want=$(cd "$work/out/peftc" && ls -- *.safetensors config.json | sort)
got=$(cd "$work/out/quickstart" && ls -- *.safetensors config.json | sort)
[ "$want" = "$got" ] || { echo "files differ: peftc wrote [$want], quickstart [$got]"; exit 1; }
for f in $want; do cmp "$work/out/peftc/$f" "$work/out/quickstart/$f"; done
echo "   the bundled quickstart's merge is byte-identical to peftc merge ($(echo "$want" | wc -w) files)"
rm -rf "$work/out"
