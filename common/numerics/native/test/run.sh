#!/usr/bin/env bash
# The native kernels' standalone tests (every *_test.cpp in this folder, no torch), each built three ways:
#   native   this machine's best ISA (-march=native: AVX2 here, NEON on an ARM machine), with OpenMP
#   scalar   no vector ISA (-DSTEPWISE_PORTABLE_SCALAR; on x86 also -mno-avx2 -mno-fma -mno-f16c)
#   avx2     on an x86 CPU with more than AVX2 (-march=haswell): the AVX2 paths an AVX-512 or VNNI CPU skips natively
#   aarch64  cross-built with aarch64-linux-gnu-g++ and run under qemu-aarch64 (NEON), from an x86 machine
#   aarch64-dotprod  the same with -march=armv8.2-a+dotprod (SDOT, which W4A8's integer sums take where it exists)
# Each test checks its own results and prints `hash <hex>` of all its outputs last; this fails unless every test
# passes in every build and each test's hashes are equal across the builds: the same bits on every ISA.
# The cross compiler and qemu come from Debian's g++-aarch64-linux-gnu and qemu-user, installed with apt-get
# when missing (as root). Usage: run.sh [builds], e.g. run.sh native,scalar (default: all five).
# run.sh bench: build linear_bench.cpp natively, at the engine's -O3, and time the portable linear against this
# core's multiply-add peak (`make native-bench`).
set -euo pipefail
cd "$(dirname "$0")"
builds=${1:-native,scalar,avx2,aarch64,aarch64-dotprod}
CXX=${CXX:-g++}
FLAGS=(-O2 -std=c++17 -ffp-contract=off -Wall -I..)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# -march=native where the compiler takes it (GCC, clang on x86 and Linux ARM), else -mcpu=native, else nothing.
native_flags=()
for flag in -march=native -mcpu=native; do
  if echo 'int main() { return 0; }' | "$CXX" "$flag" -x c++ - -o "$out/probe" 2>/dev/null; then
    native_flags=("$flag"); break
  fi
done
if echo 'int main() { return 0; }' | "$CXX" -fopenmp -x c++ - -o "$out/probe" 2>/dev/null; then
  native_flags+=(-fopenmp)
fi
if [[ $builds == bench ]]; then  # -O3 as flags.py builds the engine's: at -O2 GCC 12 kept the kernel's blocks of
  # accumulators in memory, not registers (half the speed at 64 rows on the AVX2 EPYC)
  "$CXX" "${FLAGS[@]/-O2/-O3}" "${native_flags[@]}" linear_bench.cpp -o "$out/linear_bench"
  "$out/linear_bench"
  exit
fi
scalar_flags=(-DSTEPWISE_PORTABLE_SCALAR)
[[ $(uname -m) == x86_64 ]] && scalar_flags+=(-mno-avx -mno-avx2 -mno-fma -mno-f16c)

if [[ $builds == *aarch64* && $(uname -m) != aarch64 ]] &&
   ! { command -v aarch64-linux-gnu-g++ && command -v qemu-aarch64; } >/dev/null; then
  echo "installing the aarch64 cross compiler and qemu (g++-aarch64-linux-gnu qemu-user)"
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "run.sh: needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: apt-get install g++-aarch64-linux-gnu" \
         "qemu-user), or run it as run.sh native,scalar" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q g++-aarch64-linux-gnu qemu-user >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q g++-aarch64-linux-gnu qemu-user >/dev/null; }
fi

build() {  # build <test.cpp> <name>: compile one variant into $out/<test>-<name>
  local src=$1 name=$2 bin="$out/${1%.cpp}-$2"
  case $name in
    native) "$CXX" "${FLAGS[@]}" "${native_flags[@]}" "$src" -o "$bin" ;;
    scalar) "$CXX" "${FLAGS[@]}" "${scalar_flags[@]}" "$src" -o "$bin" ;;
    avx2) if [[ $(uname -m) != x86_64 ]] || ! grep -qw avx2 /proc/cpuinfo || ! grep -qw fma /proc/cpuinfo; then
            return 0; fi
          "$CXX" "${FLAGS[@]}" -march=haswell -fopenmp "$src" -o "$bin" ;;
    aarch64*) if [[ $(uname -m) == aarch64 ]]; then return 0; fi
              local arch=(); [[ $name == aarch64-dotprod ]] && arch=(-march=armv8.2-a+dotprod)
              aarch64-linux-gnu-g++ "${FLAGS[@]}" "${arch[@]}" -fopenmp -static "$src" -o "$bin" 2>"$bin.log" ||
                { cat "$bin.log" >&2; return 1; } ;;
  esac
}

run() {  # run <binary> <name>: its output, under qemu for aarch64
  if [[ $2 == aarch64* ]]; then qemu-aarch64 "$1"; else "$1"; fi
}

status=0
for src in *_test.cpp; do
  pids=()
  IFS=, read -ra names <<<"$builds"
  for name in "${names[@]}"; do build "$src" "$name" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  [[ $status -eq 0 ]] || { echo "FAIL: $src did not build" >&2; exit 1; }
  hashes=()
  for name in "${names[@]}"; do
    bin="$out/${src%.cpp}-$name"
    [[ -x $bin ]] || continue
    if ! result=$(run "$bin" "$name"); then
      echo "$result" | sed "s/^/  $name: /"
      echo "FAIL: $src ($name) found wrong bits" >&2; status=1; continue
    fi
    hash=$(echo "$result" | awk '/^hash /{print $2}' | tail -1)
    echo "$src ($name): $(echo "$result" | tail -2 | head -1); hash $hash"
    hashes+=("$hash")
  done
  if [[ $(printf '%s\n' "${hashes[@]}" | sort -u | wc -l) -ne 1 ]]; then
    echo "FAIL: $src gives different bits on different ISAs: ${hashes[*]}" >&2; status=1
  fi
done
[[ $status -eq 0 ]] && echo "native-check: every build of every test gives the same hash"
exit $status
