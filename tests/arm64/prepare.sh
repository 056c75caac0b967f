#!/usr/bin/env bash
# An aarch64 Python with torch, for running the engine itself under qemu-aarch64 on an x86 machine
# (tests/test_arm64.py): what `make native-check` does for the kernels alone, done for stage 04 whole.
#   root/   Debian's python3.11 for arm64 and the libraries it loads (apt-get download, unpacked, not installed)
#   site/   torch and the engine's other imports, aarch64 wheels from PyPI (uv, else pip, install --target)
#   cxx     the aarch64 cross compiler (g++, with OpenMP), run natively, so our kernels build at native speed
#   clang   clang++ for aarch64 as a Mac's compiler builds: -mcpu=apple-m1 (dot products), no libomp (our own threads)
# torch is 2.10.0, not the project's 2.13.0: PyPI's aarch64 wheels from 2.11 on need CUDA's libraries to import,
# and 2.10.0 is the newest CPU-only one. Needs root (dpkg --add-architecture arm64, apt-get), a network to Debian's
# and PyPI's packages, and about 1 GB in $STEPWISE_HOME/arm64 ($STEPWISE_ARM64 names another folder).
# Idempotent: a folder this version of the script finished is left as it is.
set -euo pipefail
ROOT_DIR=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${STEPWISE_ARM64:-${STEPWISE_HOME:-$HOME/.cache/stepwise}/arm64}
STAMP=$(sha256sum "$0" | cut -c1-16)  # a folder prepared by another version of this script is prepared again
[[ -f $DEST/ready && $(cat "$DEST/ready") == "$STAMP" ]] && exit 0
[[ $(uname -m) == x86_64 ]] || { echo "tests/arm64/prepare.sh: for x86 machines (an ARM one runs the suite itself)"; exit 0; }
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then  # not fatal: the test skips, saying so
  echo "tests/arm64/prepare.sh: needs root and apt-get (Debian's arm64 packages); tests/test_arm64.py skips" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "preparing an aarch64 Python with torch in $DEST (once)"
dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
apt-get update -q >/dev/null
command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null && command -v clang++ >/dev/null ||
  apt-get install -y -q g++-aarch64-linux-gnu qemu-user clang >/dev/null
rm -rf "$DEST/root" "$DEST/site" "$DEST/debs" && mkdir -p "$DEST/debs"
# python3.11 and every library it or torch loads (the C and C++ runtimes come from the same packages)
PACKAGES=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libpython3.11-dev libpython3.11 libc6
          libgcc-s1 libstdc++6 libgomp1 libexpat1 zlib1g libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0
          libncursesw6 libtinfo6 libreadline8 libuuid1 libdb5.3 libgdbm6 libnsl2 libtirpc3 libcrypt1)
(cd "$DEST/debs" && apt-get download -q -o APT::Sandbox::User=root "${PACKAGES[@]/%/:arm64}" >/dev/null)
for deb in "$DEST"/debs/*.deb; do dpkg -x "$deb" "$DEST/root"; done
rm -rf "$DEST/debs"
PIP=("$ROOT_DIR/.venv/bin/pip" install -q --disable-pip-version-check --target "$DEST/site" --only-binary=:all:
     --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64
     --python-version 3.11 --implementation cp)
# uv where the set-up put it in the venv (tests/bootstrap/installer.py: pip's settings handed to it; .pyc files
# compiled as pip compiles them, or each qemu run would compile torch's modules anew), else pip; pip again, from an
# empty folder, where uv fails
UV=("$ROOT_DIR/.venv/bin/python" "$ROOT_DIR/tests/bootstrap/installer.py" "$ROOT_DIR/.venv/bin/python"
    --target "$DEST/site" --only-binary :all: --python-platform aarch64-manylinux_2_28 --python-version 3.11
    --compile-bytecode)
REST=(--upgrade filelock typing-extensions sympy networkx fsspec setuptools
      $(grep -oE '"(numpy|safetensors|tokenizers|gguf|jinja2|rich|pytest|hypothesis)==[^"]+"' "$ROOT_DIR/pyproject.toml" |
        tr -d '"'))  # pytest too: tests/arm64/python -m pytest tests/test_native_linear.py runs the kernel tests on ARM
if ! [[ -x $ROOT_DIR/.venv/bin/uv && ${STEPWISE_INSTALLER:-uv} != pip ]] ||
   ! { "${UV[@]}" --no-deps torch==2.10.0 && "${UV[@]}" "${REST[@]}"; }; then
  rm -rf "$DEST/site"
  "${PIP[@]}" --no-deps torch==2.10.0
  "${PIP[@]}" "${REST[@]}"
fi
cat > "$DEST/cxx" <<EOF
#!/bin/sh
# aarch64-linux-gnu-g++, finding the aarch64 Python's pyconfig.h
exec aarch64-linux-gnu-g++ -idirafter "$DEST/root/usr/include" "\$@"
EOF
cat > "$DEST/clang" <<EOF
#!/bin/sh
# clang++ for aarch64 (the GCC cross sysroot's headers and libraries) as for an Apple M1, finding pyconfig.h
exec clang++ --target=aarch64-linux-gnu -mcpu=apple-m1 -idirafter "$DEST/root/usr/include" "\$@"
EOF
chmod +x "$DEST/cxx" "$DEST/clang"
"$ROOT_DIR/tests/arm64/python" -c "import torch, numpy, tokenizers; print('aarch64 python', torch.__version__)"
echo "$STAMP" > "$DEST/ready"
