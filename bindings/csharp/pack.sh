#!/usr/bin/env bash
# Builds the NuGet package PeftC.<version>.nupkg without the dotnet SDK: PeftC.dll from
# PeftC.legacy.csproj (Mono's xbuild), the native library, the .nuspec, and the parts NuGet's package
# format (Open Packaging Conventions) wants: [Content_Types].xml and _rels/.rels. Layout:
#   PeftC.nuspec
#   lib/netstandard2.0/PeftC.dll, PeftC.xml
#   runtimes/linux-x64/native/libpeft_c.so      (and runtimes/linux-arm64/native/ with --arm64 LIB)
#   contentFiles/any/any/peft_c/arch/*.json             (the translation tables, copied into the
#                                                        program's folder; src/DataDir.cs points the
#                                                        library at them)
#   build/PeftC.targets, buildTransitive/PeftC.targets   (copy the native library and the tables next
#                                                        to a .NET Framework / Mono program; .NET
#                                                        resolves runtimes/ and contentFiles itself)
# Usage: bindings/csharp/pack.sh OUT_DIR [--x64 LIB] [--arm64 LIB]
#   LIB: a built libpeft_c.so (default build/libpeft_c.so; with --arm64 for example
#   build-aarch64/libpeft_c.so from scripts/test-aarch64.sh). Prints the package's path.
# The DllImport name "peft_c" needs no .dll.config: the file is named libpeft_c.so, which Mono's and
# .NET's probing (lib prefix, .so suffix) find in the program's folder or runtimes/<rid>/native/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:?usage: pack.sh OUT_DIR [--x64 LIB] [--arm64 LIB]}; shift
x64=$root/build/libpeft_c.so arm64=
while [ $# -gt 0 ]; do
  case $1 in
    --x64) x64=$2; shift 2 ;;
    --arm64) arm64=$2; shift 2 ;;
    *) echo "pack.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
version=$(sed -n 's/^project(peft_c VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
[ -n "$version" ] || { echo "pack.sh: no version in CMakeLists.txt" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

xbuild /nologo /v:minimal "$here/PeftC.legacy.csproj" /p:OutputPath="$stage/bin/" \
  /p:BaseIntermediateOutputPath="$stage/obj/" >"$stage/xbuild.log" 2>&1 || { cat "$stage/xbuild.log"; exit 1; }

pkg=$stage/pkg
mkdir -p "$pkg/lib/netstandard2.0" "$pkg/build" "$pkg/buildTransitive" "$pkg/_rels"
cp "$stage/bin/PeftC.dll" "$stage/bin/PeftC.xml" "$pkg/lib/netstandard2.0/"
for rid in linux-x64 linux-arm64; do
  lib=$x64; [ $rid = linux-arm64 ] && lib=$arm64
  [ -n "$lib" ] || continue
  [ -f "$lib" ] || { echo "pack.sh: no library at $lib" >&2; exit 1; }
  mkdir -p "$pkg/runtimes/$rid/native"
  cp -L "$lib" "$pkg/runtimes/$rid/native/libpeft_c.so"
done
mkdir -p "$pkg/contentFiles/any/any/peft_c/arch"
cp "$root"/data/arch/*.json "$pkg/contentFiles/any/any/peft_c/arch/"
cp "$here/build/PeftC.targets" "$pkg/build/PeftC.targets"
cp "$here/build/PeftC.targets" "$pkg/buildTransitive/PeftC.targets"

cat > "$pkg/PeftC.nuspec" <<XML
<?xml version="1.0" encoding="utf-8"?>
<package xmlns="http://schemas.microsoft.com/packaging/2013/05/nuspec.xsd">
  <metadata>
    <id>PeftC</id>
    <version>$version</version>
    <authors>peft_c</authors>
    <description>C# binding of peft_c: safetensors checkpoints and PEFT LoRA adapters (read, translate, merge, export, serve), with the native library (runtimes/linux-x64/native; it needs libopenblas0 and libpcre2-8-0).</description>
    <projectUrl>https://github.com/peft-c/peft_c</projectUrl>
    <repository type="git" url="https://github.com/peft-c/peft_c" />
    <dependencies>
      <group targetFramework=".NETStandard2.0">
        <dependency id="System.Memory" version="4.5.5" exclude="Build,Analyzers" />
      </group>
    </dependencies>
    <contentFiles>
      <files include="any/any/peft_c/arch/*.json" buildAction="None" copyToOutput="true" flatten="false" />
    </contentFiles>
  </metadata>
</package>
XML
cat > "$pkg/[Content_Types].xml" <<'XML'
<?xml version="1.0" encoding="utf-8"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">
  <Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml" />
  <Default Extension="nuspec" ContentType="application/octet" />
  <Default Extension="dll" ContentType="application/octet" />
  <Default Extension="xml" ContentType="application/octet" />
  <Default Extension="so" ContentType="application/octet" />
  <Default Extension="targets" ContentType="application/octet" />
  <Default Extension="json" ContentType="application/octet" />
</Types>
XML
cat > "$pkg/_rels/.rels" <<'XML'
<?xml version="1.0" encoding="utf-8"?>
<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">
  <Relationship Type="http://schemas.microsoft.com/packaging/2010/07/manifest" Target="/PeftC.nuspec" Id="R0" />
</Relationships>
XML

nupkg=$out/PeftC.$version.nupkg
rm -f "$nupkg"
(cd "$pkg" && python3 - "$nupkg" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    # [Content_Types].xml first, as NuGet's own packages have it.
    names = sorted((os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk(".") for f in fs),
                   key=lambda n: (n != "[Content_Types].xml", n))
    for name in names:
        z.write(name, name)
PY
)
echo "$nupkg"
