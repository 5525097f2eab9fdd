#!/usr/bin/env bash
# Packages both crates and builds the packaged peft-c-sys with `bundled` in isolation:
#  1. scripts/sync-native-sources.sh rust (peft-c-sys/csrc, the C++ sources the crate carries);
#  2. cargo package -p peft-c-sys -p peft-c --no-verify: the .crate files;
#  3. scripts/sync-native-sources.sh --check, and the .crate holds exactly csrc's files;
#  4. the verification, done here rather than by cargo (whose check of peft-c would compile the C++ a
#     second time, from another folder): both .crate files unpacked into
#     $CARGO_TARGET_DIR/package/<name>-<version>/ (where cargo's own verification unpacks them,
#     outside the repository), and a fresh program (examples/rust/src/bin/quickstart.rs) built on
#     them with peft-c's `bundled` feature and pkg-config made unusable (PKG_CONFIG=false, no
#     PKG_CONFIG_PATH): it must not load libpeft_c; it runs on the fixtures and its merged model must
#     be byte-identical to `peftc merge` (PEFTC).
# With ccache installed it serves the C++ compiler; the unpacked crates keep their folder from run to
# run, so the compile is cached until the sources change.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
peftc=${PEFTC:-$root/build/peftc}
cargo=$(command -v cargo || echo "$HOME/.cargo/bin/cargo")
export PATH=$(dirname "$cargo"):$PATH
cache=${XDG_CACHE_HOME:-$HOME/.cache}/peft_c
work=$cache/rust-bundled
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/cargo-target}
if command -v ccache >/dev/null; then export CC="ccache cc" CXX="ccache c++"; fi
export PKG_CONFIG=false   # the bundled build must not ask pkg-config for anything
unset PKG_CONFIG_PATH

"$root/scripts/sync-native-sources.sh" rust
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/bindings/rust/Cargo.toml")
(cd "$root/bindings/rust" && "$cargo" package --locked --no-verify --allow-dirty -q -p peft-c-sys -p peft-c)
"$root/scripts/sync-native-sources.sh" --check
sys_crate=$CARGO_TARGET_DIR/package/peft-c-sys-$version.crate
safe_crate=$CARGO_TARGET_DIR/package/peft-c-$version.crate
want=$(cd "$root/bindings/rust/peft-c-sys" && find csrc -type f | LC_ALL=C sort)
got=$(tar -tzf "$sys_crate" | sed -n "s#^peft-c-sys-$version/\(csrc/.*[^/]\)\$#\1#p" | LC_ALL=C sort)
if [ "$want" != "$got" ]; then
  echo "$sys_crate does not carry csrc/ whole:"; diff <(echo "$want") <(echo "$got") | head; exit 1
fi
echo "   packaged: $(basename "$sys_crate") ($(du -k "$sys_crate" | cut -f1) KiB, $(echo "$got" | wc -l) files in csrc/), $(basename "$safe_crate")"

for crate in "$sys_crate" "$safe_crate"; do
  rm -rf "${crate%.crate}"
  tar -xzf "$crate" -C "$CARGO_TARGET_DIR/package"
done
mkdir -p "$work/app/src"
cat > "$work/app/Cargo.toml" <<TOML
[package]
name = "quickstart"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
peft-c = { path = "$CARGO_TARGET_DIR/package/peft-c-$version", features = ["bundled"] }

[patch.crates-io]
peft-c-sys = { path = "$CARGO_TARGET_DIR/package/peft-c-sys-$version" }

[workspace]
TOML
cmp -s "$root/examples/rust/src/bin/quickstart.rs" "$work/app/src/main.rs" ||
  cp "$root/examples/rust/src/bin/quickstart.rs" "$work/app/src/main.rs"
start=$SECONDS
(cd "$work/app" && CARGO_TARGET_DIR="$work/target" "$cargo" build -q)
echo "   cargo build (bundled, from the packaged crates): $((SECONDS - start)) s"
program=$work/target/debug/quickstart
if ldd "$program" | grep -q libpeft_c; then echo "the bundled program loads libpeft_c:"; ldd "$program"; exit 1; fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
base=$root/tests/fixtures/models/llama adapter=$root/tests/fixtures/adapters/llama_lora
env -u LD_LIBRARY_PATH -u PEFT_C_DATA_DIR "$program" "$base" "$adapter" "$out/quickstart"
"$peftc" merge --base "$base" --adapter "$adapter" --out "$out/peftc" >/dev/null
files=$(cd "$out/peftc" && ls -- *.safetensors config.json | sort)
[ "$files" = "$(cd "$out/quickstart" && ls -- *.safetensors config.json | sort)" ] || { echo "the merged files differ"; exit 1; }
for f in $files; do cmp "$out/peftc/$f" "$out/quickstart/$f"; done
echo "   the bundled quickstart's merge is byte-identical to peftc merge ($(echo "$files" | wc -w) files)"
