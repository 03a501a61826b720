#!/usr/bin/env bash
# ci/release.sh — the portable release: mpib-<version>-<arch>.tar.gz, loadable on glibc 2.28
# and later (RHEL/Rocky 8, Ubuntu 20.04, Debian 10 and newer), for x86_64 and aarch64.
#
#   ci/release.sh [--arch x86_64|aarch64|all] [--out DIR] [--no-check]
#
# Each archive holds one folder mpib-<version>-<arch>/ with
#   lib/libnccl-net-mpib.so        the plugin, a real file (stripped), the name NCCL_NET_PLUGIN=mpib finds
#   lib/libnccl-net-mpib.so.debug  its debug information (gdb finds it through .gnu_debuglink)
#   bin/mpib-perf                  the benchmark and check tool (finds ../lib/libnccl-net-mpib.so)
#   include/mpib.h  LICENSE  README.md  CHANGELOG.md  docs/  SHA256SUMS (of every other file)
# and DIR gets SHA256SUMS of the archives. The version is Cargo.toml's.
#
# How: cargo-zigbuild links against glibc 2.28's symbol versions with zig (zig ships the
# stubs of every glibc version), and rdma-mummy-sys's cmake step and its C stub compile with
# the same zig cc (cargo-zigbuild hands cmake a toolchain file); bindgen parses the vendored
# rdma-core headers with the host's libclang. zig and cargo-zigbuild come from PyPI (ziglang,
# cargo-zigbuild) into a virtual environment under $MPIB_RELEASE_TOOLS (default
# ~/.cache/mpib-release/...), installed once per machine. DESIGN.md "Release" says why.
#
# Checks (ci/elf_check.py) on every build: the highest GLIBC symbol version each file needs is
# at most 2.28, NEEDED holds only glibc's libraries (libc, libm, libdl, libpthread, librt),
# libgcc_s and the dynamic loader, the plugin exports its ncclNet tables, the debug link is
# there. Unless --no-check, for this host's architecture: the archive is unpacked, its
# SHA256SUMS verified, and its mpib-perf lists the devices and passes a checked run (every
# byte, soft fabric on loopback) against the unpacked plugin. Another architecture's files are
# checked as ELF, and where qemu-user and that architecture's libc (Debian: qemu-user,
# libc6-arm64-cross) are installed, its unpacked mpib-perf --list runs under emulation.
#
# Output: DIR (default <cargo target dir>/release-dist); its last line is `release: DIR`.
# Env: MPIB_RELEASE_TOOLS (where zig and cargo-zigbuild are installed), SOURCE_DATE_EPOCH
# (the files' time in the archive; default the last commit's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

GLIBC=2.28
ZIGLANG_VERSION=0.17.1
CARGO_ZIGBUILD_VERSION=0.24.1
say() { echo "ci/release.sh: $*" >&2; }
die() { say "$*"; exit 1; }
usage() {
  echo "usage: ci/release.sh [--arch x86_64|aarch64|all] [--out DIR] [--no-check]" >&2
  exit 2
}

host_arch=$(uname -m)
arches=("$host_arch") out='' check=1
while (($#)); do
  case $1 in
    --arch)
      (($# >= 2)) || usage
      case $2 in
        all) arches=(x86_64 aarch64) ;;
        x86_64 | aarch64) arches=("$2") ;;
        *) say "--arch $2: x86_64, aarch64 or all"; usage ;;
      esac
      shift 2
      ;;
    --out)
      (($# >= 2)) || usage
      out=$2
      shift 2
      ;;
    --no-check) check=0; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown argument $1"; usage ;;
  esac
done

t_start=$(date +%s)
ci/setup.sh release "${arches[@]}"

version=$(ci/release_info.py version)
target_dir=$(ci/release_info.py target-dir)
out=${out:-$target_dir/release-dist}
# Never into the source tree (cargo's target dir inside the checkout is not source).
out_abs=$(realpath -m "$out")
if [[ $out_abs/ == "$(pwd -P)"/* && $out_abs/ != "$(realpath -m "$target_dir")"/* ]]; then
  die "--out $out is inside the source tree: choose a folder outside it (default: cargo's target dir)"
fi
mkdir -p "$out"
out=$(realpath "$out")
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
[[ -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] || say "note: tracked files differ from the last commit: the banner will say <commit>-dirty"

# ---- tools: zig and cargo-zigbuild (PyPI), the Rust targets ----------------------------
tools=${MPIB_RELEASE_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/mpib-release/zig-$ZIGLANG_VERSION-cargo-zigbuild-$CARGO_ZIGBUILD_VERSION}
if [[ ! -f $tools/.installed ]]; then
  t0=$(date +%s)
  say "installing ziglang==$ZIGLANG_VERSION and cargo-zigbuild==$CARGO_ZIGBUILD_VERSION (PyPI) into $tools"
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check \
    "ziglang==$ZIGLANG_VERSION" "cargo-zigbuild==$CARGO_ZIGBUILD_VERSION"
  touch "$tools/.installed"
  say "tools installed in $(($(date +%s) - t0))s"
fi
# cargo-zigbuild runs zig as `python3 -m ziglang` from the venv's python.
export PATH="$tools/bin:$PATH"
installed_targets=$(rustup target list --installed)
for arch in "${arches[@]}"; do
  triple=$(ci/release_info.py triple "$arch")
  if ! grep -qx "$triple" <<<"$installed_targets"; then
    say "adding the Rust target $triple (rustup)"
    rustup target add "$triple" >&2
  fi
done

# ---- build, package, check ---------------------------------------------------------------
times=''
tarballs=()
for arch in "${arches[@]}"; do
  triple=$(ci/release_info.py triple "$arch")
  name=mpib-$version-$arch
  t0=$(date +%s)
  say "building $name ($triple, glibc $GLIBC) with cargo zigbuild"
  mapfile -t built < <(ci/cargo_artifacts.py cdylib:mpib bin:mpib-perf -- zigbuild --release --locked \
    -p mpib -p mpib-tools --lib --bin mpib-perf --target "$triple.$GLIBC")
  ((${#built[@]} == 2)) || die "cargo zigbuild did not report the plugin and mpib-perf"
  t1=$(date +%s)

  objcopy=$arch-linux-gnu-objcopy
  stage=$out/stage/$name
  rm -rf "$out/stage" && mkdir -p "$stage"/{lib,bin,include}
  plugin=$stage/lib/libnccl-net-mpib.so
  "$objcopy" --only-keep-debug "${built[0]}" "$plugin.debug"
  # --add-gnu-debuglink reads the debug file (a CRC of it) and records its base name.
  (cd "$stage/lib" && "$objcopy" --strip-unneeded --add-gnu-debuglink=libnccl-net-mpib.so.debug "${built[0]}" libnccl-net-mpib.so)
  "$objcopy" --strip-unneeded "${built[1]}" "$stage/bin/mpib-perf"
  chmod 0755 "$plugin" "$stage/bin/mpib-perf"
  chmod 0644 "$plugin.debug"
  cp include/mpib.h "$stage/include/"
  cp LICENSE README.md CHANGELOG.md "$stage/"
  [[ -d docs ]] && cp -r docs "$stage/docs"
  mapfile -t files < <(cd "$stage" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort)
  (cd "$stage" && sha256sum "${files[@]}" > SHA256SUMS)

  allowed=$(ci/release_info.py allowed-needed "$arch")
  host_args=(--no-host --no-ldd)
  [[ $arch == "$host_arch" ]] && host_args=()
  say "checking $name's files (ci/elf_check.py: glibc <= $GLIBC, NEEDED within $allowed)"
  python3 ci/elf_check.py "${host_args[@]}" --max-glibc "$GLIBC" --allow-needed "$allowed" "$plugin"
  python3 ci/elf_check.py "${host_args[@]}" --max-glibc "$GLIBC" --allow-needed "$allowed" --program "$stage/bin/mpib-perf"
  sections=$(readelf -S --wide "$plugin")
  ! grep -q '\.debug_' <<<"$sections" || die "$plugin still has debug sections"
  grep -q '\.gnu_debuglink' <<<"$sections" || die "$plugin has no .gnu_debuglink"
  debug_sections=$(readelf -S --wide "$plugin.debug")
  grep -q '\.debug_line' <<<"$debug_sections" || die "$plugin.debug has no line tables"

  tarball=$out/$name.tar.gz
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=gnu \
    --use-compress-program='gzip -n -9' -C "$out/stage" -cf "$tarball" "$name"
  rm -rf "$out/stage"
  tarballs+=("$tarball")
  t2=$(date +%s)
  times+="${times:+, }$arch build $((t1 - t0))s package $((t2 - t1))s"

  if ((check)) && [[ $arch == "$host_arch" ]]; then
    say "checking the unpacked $name: SHA256SUMS, mpib-perf --list, a checked run"
    unpacked=$out/check-$arch
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    tar -C "$unpacked" -xzf "$tarball"
    root=$unpacked/$name
    (cd "$root" && sha256sum --quiet -c SHA256SUMS)
    # Nothing from this checkout or the caller's environment may point at another plugin.
    clean=(env -u NCCL_NET_PLUGIN -u LD_LIBRARY_PATH -u LD_PRELOAD)
    while IFS= read -r var; do clean+=(-u "$var"); done < <(compgen -e | grep '^MPIB_' || true)
    loopback=(MPIB_SOFT_SOUT_ADDR=127.0.0.1 MPIB_SOFT_SUP_ADDR=127.0.0.1)
    listing=$("${clean[@]}" "${loopback[@]}" "$root/bin/mpib-perf" --list --fabric soft)
    echo "$listing"
    grep -qF -- "# mpib-perf --list: $root/lib/libnccl-net-mpib.so " <<<"$listing" || die "the unpacked mpib-perf did not find the unpacked plugin"
    grep -q -- '--dev 0: \[0\] soft-sout+soft-sup' <<<"$listing" || die "the unpacked mpib-perf --list shows no device 0"
    "${clean[@]}" "$root/bin/mpib-perf" --check --sizes 8:1M --duration 2 --json "$unpacked/perf.json"
    rm -rf "$unpacked"
    times+=" check $(($(date +%s) - t2))s"
  elif ((check)) && command -v "qemu-$arch" >/dev/null && [[ -e /usr/$arch-linux-gnu/lib/libc.so.6 ]]; then
    # Another architecture, where Debian's qemu-user and libc6-<arch>-cross are installed:
    # the unpacked mpib-perf under emulation loads the unpacked plugin and lists its devices.
    # (Not a run: mpib-perf's ranks re-execute it, which needs binfmt_misc.)
    say "checking the unpacked $name under qemu-$arch: mpib-perf --list"
    unpacked=$out/check-$arch
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    tar -C "$unpacked" -xzf "$tarball"
    root=$unpacked/$name
    (cd "$root" && sha256sum --quiet -c SHA256SUMS)
    listing=$(env -u NCCL_NET_PLUGIN -u LD_LIBRARY_PATH QEMU_LD_PREFIX="/usr/$arch-linux-gnu" MPIB_FABRIC=soft \
      MPIB_SOFT_SOUT_ADDR=127.0.0.1 MPIB_SOFT_SUP_ADDR=127.0.0.1 "qemu-$arch" "$root/bin/mpib-perf" --list)
    echo "$listing"
    grep -q -- '--dev 0: \[0\] soft-sout+soft-sup' <<<"$listing" || die "the unpacked $arch mpib-perf --list shows no device 0"
    rm -rf "$unpacked"
    times+=" check (qemu, --list) $(($(date +%s) - t2))s"
  elif ((check)); then
    say "$name: not run here ($host_arch host; qemu-$arch and libc6-${arch//_/-}-cross would let it list its devices); its files were checked as ELF only (glibc, NEEDED, tables)"
  fi
done

(cd "$out" && sha256sum "${tarballs[@]##*/}" > SHA256SUMS)
for t in "${tarballs[@]}"; do
  say "$(basename "$t"): $(stat -c %s "$t") bytes"
done
say "done in $(($(date +%s) - t_start))s ($times)"
echo "release: $out"
