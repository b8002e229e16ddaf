#!/usr/bin/env bash
# Installs the Debian packages Piper needs to build and test. Idempotent: when
# every package is already present it only checks and returns (well under a
# second), so the README's commands can call it every time.
set -euo pipefail

packages=(
  build-essential pkg-config
  libcjson-dev libglib2.0-dev libcairo2-dev gnuplot-nox libcmocka-dev
  libopenmpi-dev openmpi-bin libopenblas-dev
  clang python3 graphviz
)
# lizard (make lint) comes from PyPI; pip itself from Debian when it is missing.
have_lizard() {
  command -v lizard >/dev/null 2>&1 || python3 -c "import lizard" >/dev/null 2>&1
}
if ! have_lizard && ! python3 -m pip --version >/dev/null 2>&1; then
  packages+=(python3-pip)
fi

install_lizard() {
  have_lizard && return 0
  echo "install-deps: installing lizard (pip)"
  # Debian 12's pip refuses system-wide installs without --break-system-packages (PEP 668);
  # older pips do not know the flag.
  python3 -m pip install -q --break-system-packages lizard 2>/dev/null ||
    python3 -m pip install -q lizard
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  install_lizard
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_lizard
