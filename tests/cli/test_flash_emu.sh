#!/bin/bash
# The fused attention kernels (kernels/flash_attention.cu) run on the host through
# tests/gpu/emu/fake_cuda.hpp against a plain reference: indexing, causal masking, sequence
# tails (S not a multiple of the 64-row tile), grouped-query heads, several sequences, and
# the barriers, checked without a GPU (tests/gpu/check_kernels.c checks the same on one).
# Needs g++ with C++20 (<barrier>); skipped, with a line, without it.
set -u
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the launch syntax <<<grid, block, bytes, stream>>>(args) becomes fake_launch(grid, ..., args)
sed -E 's/([A-Za-z_0-9]+(<[A-Za-z0-9_]+>)?)<<<(.*)>>>\(/fake_launch(\3, \1, /' \
  kernels/flash_attention.cu > "$tmp/flash_attention_emu.cpp"
# the stand-ins take the CUDA headers' names (*.hpp in the tree: every *.h there is C)
cp tests/gpu/emu/cuda_bf16.hpp "$tmp/cuda_bf16.h"
cp tests/gpu/emu/mma_sm80.hpp "$tmp/mma_sm80.cuh"
if ! command -v g++ > /dev/null ||
  ! g++ -std=c++20 -O2 -pthread -Ikernels -I"$tmp" -include tests/gpu/emu/fake_cuda.hpp \
    tests/gpu/emu/flash_emu.cpp -o "$tmp/flash_emu" 2> "$tmp/build.log"; then
  if grep -q 'barrier' "$tmp/build.log" 2> /dev/null || ! command -v g++ > /dev/null; then
    echo "skip: test_flash_emu needs g++ with C++20's <barrier>"
    exit 0
  fi
  cat "$tmp/build.log"
  echo "test_flash_emu: the emulated kernels do not build"
  exit 1
fi
pass=0 fail=0
# batch seq heads kv_heads head_dim: one row; one exact tile; a partial single tile over two
# sequences; three tiles with a 2-row tail; GQA groups of 2 and 3; every head size the kernels
# have. Small: a block runs as real threads, a few seconds each on a loaded machine.
for shape in "1 1 1 1 32" "1 64 2 2 64" "2 40 2 1 32" "1 130 2 1 128" "1 70 3 1 64"; do
  # shellcheck disable=SC2086
  if timeout 120 "$tmp/flash_emu" $shape; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
echo "test_flash_emu: $pass passed, $fail failed"
[ "$fail" = 0 ]
