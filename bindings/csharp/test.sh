#!/usr/bin/env bash
# Tests of the C# binding and the C# example, with Debian's mono (mcs + mono; no dotnet SDK, no NuGet).
# scripts/test.sh runs it from the repository root as `bash bindings/csharp/test.sh`, after installing the
# library into build/prefix with PKG_CONFIG_PATH and LD_LIBRARY_PATH pointing there. Steps: compile PeftC.dll
# (warnings are errors), compile and run the tests (bindings/csharp/tests, one exe with the library sources),
# check that the README snippet is examples/csharp/Example.cs, then build and run the example on the fixtures
# and compare its merged model byte for byte with `peftc merge`; check that PeftC.csproj and
# PeftC.legacy.csproj list src/*.cs; build the NuGet package (pack.sh) and use it as a user would
# (xbuild against the unpacked package, mono without a library path). Build output goes to
# $PEFT_CSHARP_BUILD (default ~/.cache/peft_c/csharp), never into the repository. Exits nonzero on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/bindings/csharp

for tool in mcs mono pkg-config; do
  if ! command -v "$tool" >/dev/null; then
    echo "bindings/csharp/test.sh: $tool not found (Debian: apt-get install mono-mcs mono-runtime pkg-config)" >&2
    exit 1
  fi
done
if ! pkg-config --exists peft_c; then
  echo "bindings/csharp/test.sh: pkg-config does not find peft_c (PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-})" >&2
  exit 1
fi
# The library is loaded from the .pc file's folder (which copes with a prefix moved after installing).
libdir=$(cd "$(pkg-config --variable=pcfiledir peft_c)/.." && pwd)
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PEFT_TEST_DATA=${PEFT_TEST_DATA:-$root/tests/fixtures}
peftc=${PEFTC:-$root/build/peftc}

out=${PEFT_CSHARP_BUILD:-$HOME/.cache/peft_c/csharp}
mkdir -p "$out" || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failures=()
step() {  # step NAME CMD...: runs CMD, records a failure, continues
  local name=$1; shift
  echo "-- csharp: $name"
  if ! "$@"; then
    echo "-- csharp: $name: FAILED"
    failures+=("$name")
  fi
}

mcs_flags=(-unsafe -langversion:7.2 -warn:4 -warnaserror -debug -nologo)

build_library() {
  mcs "${mcs_flags[@]}" -target:library -out:"$out/PeftC.dll" -doc:"$out/PeftC.xml" -nowarn:1591 "$here"/src/*.cs &&
    cp "$here/PeftC.dll.config" "$out/PeftC.dll.config"
}

run_tests() {
  mcs "${mcs_flags[@]}" -r:System.Json.dll -out:"$out/PeftC.Tests.exe" "$here"/src/*.cs "$here"/tests/*.cs || return 1
  cp "$here/PeftC.dll.config" "$out/PeftC.Tests.exe.config"
  local log=$work/tests.log
  (cd "$root" && mono --debug "$out/PeftC.Tests.exe") >"$log" 2>&1
  local rc=$?
  grep -E '^(FAIL|SKIP) ' "$log" | head -80
  local summary
  summary=$(tail -1 "$log")
  echo "   tests: $summary"
  if ! [[ "$summary" =~ ^[0-9]+\ passed,\ [0-9]+\ failed$ ]]; then
    echo "   the test program did not finish:"; tail -30 "$log"; return 1
  fi
  return $rc
}

# The README's snippets must be examples/csharp/Example.cs and Quickstart.cs, verbatim.
readme_snippet() {
  local file
  for file in examples/csharp/Example.cs examples/csharp/Quickstart.cs; do
    awk -v marker="<!-- example: $file -->" '$0 == marker {f=1; next} f && /^```csharp$/{g=1; next} g && /^```$/{exit} g' \
      "$here/README.md" > "$work/snippet.cs"
    if ! diff -u "$root/$file" "$work/snippet.cs"; then
      echo "bindings/csharp/README.md's snippet differs from $file"
      return 1
    fi
  done
}

# Runs the example on the fixtures; its merged model must be byte-identical to what peftc writes.
example() {
  mcs "${mcs_flags[@]}" -r:"$out/PeftC.dll" -out:"$out/Example.exe" "$root/examples/csharp/Example.cs" || return 1
  local base=tests/fixtures/models/llama adapter=tests/fixtures/adapters/llama_lora
  (cd "$root" && MONO_PATH=$out mono --debug "$out/Example.exe" "$base" "$adapter" "$work/example") || return 1
  if [ ! -x "$peftc" ]; then
    echo "no peftc at $peftc (set PEFTC) to compare the example's merge with"
    return 1
  fi
  (cd "$root" && "$peftc" merge --base "$base" --adapter "$adapter" --out "$work/peftc") >/dev/null || return 1
  local want got f
  want=$(cd "$work/peftc" && ls ./*.safetensors | sort)
  got=$(cd "$work/example/merged" && ls ./*.safetensors | sort)
  if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "safetensors files differ: peftc wrote [$want], the example [$got]"
    return 1
  fi
  for f in $want; do
    cmp "$work/peftc/$f" "$work/example/merged/$f" || return 1
  done
  for f in adapter/adapter_model.safetensors adapter/adapter_config.json; do
    [ -s "$work/example/$f" ] || { echo "the example did not write $f"; return 1; }
  done
  echo "   the example's merge is byte-identical to peftc merge ($(echo "$want" | wc -w) safetensors file(s))"
}

# PeftC.csproj (SDK-style, for dotnet; not built here) and PeftC.legacy.csproj (xbuild) must both list
# exactly src/*.cs.
project_sources() {
  local want f got
  want=$(cd "$here" && ls src/*.cs | LC_ALL=C sort)
  for f in PeftC.csproj PeftC.legacy.csproj; do
    got=$(sed -n 's#.*<Compile Include="\([^"]*\)".*#\1#p' "$here/$f" | LC_ALL=C sort)
    if [ "$got" != "$want" ]; then
      echo "$f's Compile items differ from src/*.cs:"; diff <(echo "$want") <(echo "$got"); return 1
    fi
  done
  echo "   PeftC.csproj and PeftC.legacy.csproj list the $(echo "$want" | wc -l) files of src/"
}

# The NuGet package (pack.sh, with the library pkg-config finds): its entries are exactly the layout
# NuGet expects; unpacked, a legacy project that references lib/netstandard2.0/PeftC.dll and imports the
# package's build/PeftC.targets builds the example with xbuild, and the example runs under mono with no
# .dll.config and no LD_LIBRARY_PATH (libpeft_c.so copied next to it by the .targets), merging the
# fixtures byte-identically to peftc merge.
nuget_package() {
  local nupkg lib
  lib=$(readlink -f "$libdir/libpeft_c.so")
  nupkg=$(bash "$here/pack.sh" "$work/nupkg" --x64 "$lib" | tail -1) || return 1
  local want got
  want=$(printf '%s\n' '[Content_Types].xml' PeftC.nuspec _rels/.rels build/PeftC.targets buildTransitive/PeftC.targets \
    lib/netstandard2.0/PeftC.dll lib/netstandard2.0/PeftC.xml runtimes/linux-x64/native/libpeft_c.so \
    $(cd "$root/data/arch" && ls ./*.json | sed 's#^\./#contentFiles/any/any/peft_c/arch/#'))
  got=$(python3 -c 'import sys, zipfile; print("\n".join(sorted(zipfile.ZipFile(sys.argv[1]).namelist())))' "$nupkg")
  if [ "$got" != "$(echo "$want" | LC_ALL=C sort)" ]; then
    echo "$nupkg's entries differ from the expected layout:"; diff <(echo "$want" | LC_ALL=C sort) <(echo "$got"); return 1
  fi
  local pkg=$work/unpacked app=$work/app
  mkdir -p "$pkg" "$app" && (cd "$pkg" && unzip -q "$nupkg") || return 1
  cmp "$lib" "$pkg/runtimes/linux-x64/native/libpeft_c.so" || return 1
  cp "$root/examples/csharp/Example.cs" "$app/"
  cat > "$app/Example.csproj" <<XML
<?xml version="1.0" encoding="utf-8"?>
<Project ToolsVersion="4.0" DefaultTargets="Build" xmlns="http://schemas.microsoft.com/developer/msbuild/2003">
  <PropertyGroup>
    <OutputType>Exe</OutputType>
    <AssemblyName>Example</AssemblyName>
    <TargetFrameworkVersion>v4.5</TargetFrameworkVersion>
    <OutputPath>bin/</OutputPath>
    <NoStdLib>true</NoStdLib>
  </PropertyGroup>
  <ItemGroup>
    <Reference Include="mscorlib"><HintPath>\$(MSBuildFrameworkToolsPath)/mscorlib.dll</HintPath><Private>false</Private></Reference>
    <Reference Include="System"><HintPath>\$(MSBuildFrameworkToolsPath)/System.dll</HintPath><Private>false</Private></Reference>
    <Reference Include="PeftC"><HintPath>$pkg/lib/netstandard2.0/PeftC.dll</HintPath></Reference>
    <Compile Include="Example.cs" />
  </ItemGroup>
  <Import Project="\$(MSBuildToolsPath)/Microsoft.CSharp.targets" />
  <Import Project="$pkg/build/PeftC.targets" />
</Project>
XML
  (cd "$app" && xbuild /nologo /v:minimal Example.csproj >"$work/xbuild-app.log" 2>&1) || { cat "$work/xbuild-app.log"; return 1; }
  local f
  for f in Example.exe PeftC.dll libpeft_c.so; do
    [ -f "$app/bin/$f" ] || { echo "the package's build did not put $f into the program's folder"; ls "$app/bin"; return 1; }
  done
  diff -r "$root/data/arch" "$app/bin/peft_c/arch" || { echo "the program's peft_c/arch differs from data/arch"; return 1; }
  if ls "$app/bin"/*.config >/dev/null 2>&1; then echo "a .config file appeared: $(ls "$app/bin"/*.config)"; return 1; fi
  local base=tests/fixtures/models/llama adapter=tests/fixtures/adapters/llama_lora
  (cd "$root" && env -u LD_LIBRARY_PATH -u MONO_PATH -u PEFT_C_DATA_DIR mono "$app/bin/Example.exe" "$base" "$adapter" "$work/nuget-example") >/dev/null || return 1
  [ -d "$work/peftc-nuget" ] || (cd "$root" && "$peftc" merge --base "$base" --adapter "$adapter" --out "$work/peftc-nuget") >/dev/null || return 1
  local want_files
  want_files=$(cd "$work/peftc-nuget" && ls ./*.safetensors | sort)
  [ "$want_files" = "$(cd "$work/nuget-example/merged" && ls ./*.safetensors | sort)" ] || { echo "safetensors files differ"; return 1; }
  for f in $want_files; do cmp "$work/peftc-nuget/$f" "$work/nuget-example/merged/$f" || return 1; done
  # The README's quickstart, compiled against the package's PeftC.dll into the same folder.
  mcs -nologo -r:"$app/bin/PeftC.dll" -out:"$app/bin/Quickstart.exe" "$root/examples/csharp/Quickstart.cs" || return 1
  (cd "$root" && env -u LD_LIBRARY_PATH -u MONO_PATH -u PEFT_C_DATA_DIR mono "$app/bin/Quickstart.exe" "$base" "$adapter" "$work/nuget-quickstart") || return 1
  for f in $want_files; do cmp "$work/peftc-nuget/$f" "$work/nuget-quickstart/$f" || return 1; done
  # The library reads the tables from the program's peft_c folder (PeftC sets PEFT_C_DATA_DIR): with
  # that copy broken, the merge fails naming it.
  for f in "$app"/bin/peft_c/arch/*.json; do echo '{"broken":' > "$f"; done
  local msg
  msg=$(cd "$root" && env -u LD_LIBRARY_PATH -u MONO_PATH -u PEFT_C_DATA_DIR mono "$app/bin/Quickstart.exe" "$base" "$adapter" "$work/nuget-broken" 2>&1)
  if [[ "$msg" != *"$app/bin/peft_c/arch/"* ]]; then
    echo "the library did not read the program's peft_c/arch (a broken copy there went unnoticed): $msg"; return 1
  fi
  echo "   $(basename "$nupkg"): layout checked; the example and the quickstart built against it run under mono (no config, no LD_LIBRARY_PATH, tables from the program's folder) and merge byte-identically to peftc"
}

echo "-- csharp: $(mono --version | head -1), peft_c $(pkg-config --modversion peft_c) from $libdir"
step "build PeftC.dll" build_library
step "tests" run_tests
step "README snippet" readme_snippet
step "examples/csharp" example
step "project files" project_sources
step "NuGet package" nuget_package

if [ ${#failures[@]} -gt 0 ]; then
  printf 'csharp: failed: %s\n' "${failures[@]}"
  exit 1
fi
echo "-- csharp: every step passed"
