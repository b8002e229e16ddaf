#!/usr/bin/env python3
"""The README check: runs every command block of README.md as a user would paste it and compares
the figures it prints with the output block shown under it, so that the README cannot go stale.

Convention (README.md, invisible once rendered): every ```sh block is preceded by a marker line

    <!-- readme-check -->                  run it; compare the ``` block that follows
    <!-- readme-check rtol=1e-4 wall -->    the same, figures within a relative 1e-4, times not compared
    <!-- readme-check run -->              run it; it must exit 0 (no figures shown or compared)
    <!-- readme-check skip: REASON -->     not run (a GPU, or the test target itself)

A block without a marker is an error: every command is either checked or says why not.

Tolerance (see docs/readme-check in README.md, "Development"): the simulator and the planner
are deterministic, so by default every figure must equal the README's as printed; `rtol=X`
allows |now - readme| <= X * |readme| (the executor's losses, which BLAS threading may move in
the last digits). Figures that are wall-clock never compare: a number of seconds (`in 0.7 s`)
or threads, and under `wall` also milliseconds, microseconds and tokens/s. `...` in an output
block stands for any lines; the other lines must appear in the output in order, with the same
words (a line whose words changed is reported as missing).

The blocks run in a scratch folder holding links to the repository's top-level entries (so
`bin/...`, `models/...` resolve and what they write stays out of the checkout), with
`bash -e -o pipefail`, and without OMPI_ALLOW_RUN_AS_ROOT*: a recipe must handle Open MPI's
refusal of root itself, as a user copying one command gets it.

Prints one line per stale figure ("README.md:LINE: ..."), then "readme-check: N passed, N failed"
(blocks). Exit 0 when every run block passed, 1 otherwise, 2 on a usage error.
--list prints the blocks without running them and fails on a block without a marker.
usage: tools/readme-check.py [--readme FILE] [--root DIR] [--only LINE[,LINE...]] [--list]
                              [--keep DIR] [--timeout S] [--quiet]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

MARKER = re.compile(r"^<!--\s*readme-check\b(.*?)-->\s*$")
# A figure: not part of a word, a path or a version ("h100", "pp4_mbs16", "out/2026..."), but
# "x30" counts (a repetition count).
NUMBER = re.compile(r"(?<![A-Za-wyz0-9_/.])[-+\u2212]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.]*[A-Za-z_])")
ALWAYS_WALL = re.compile(r"\s*(s|threads?)\b")
WALL_UNITS = re.compile(r"\s*(s|ms|us|tokens/s|threads?)\b")


class Block:
    def __init__(self, line, options, command):
        self.line = line          # 1-based line of the ```sh fence
        self.options = options    # the marker's text
        self.command = command
        self.expected = None      # [(line number, text)] of the output block, or None
        self.expected_line = None


def parse_options(text):
    text = text.strip()
    opts = {"skip": None, "run": False, "wall": False, "rtol": 0.0}
    if text.startswith("skip"):
        opts["skip"] = text[4:].lstrip(": ").strip() or "no reason given"
        return opts
    for word in text.split():
        if word == "run":
            opts["run"] = True
        elif word == "wall":
            opts["wall"] = True
        elif word.startswith("rtol="):
            opts["rtol"] = float(word[5:])
        else:
            raise ValueError("unknown readme-check option '%s'" % word)
    return opts


def parse_readme(path):
    """The command blocks of the README, each with its marker and the output block after it."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, errors = [], []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```sh":
            i += 1
            continue
        fence = i + 1
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        command = "\n".join(lines[i + 1:j])
        m = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        if not m:
            errors.append("%s:%d: a command block without a <!-- readme-check ... --> marker line above it"
                          % (path, fence))
            i = j + 1
            continue
        try:
            block = Block(fence, parse_options(m.group(1)), command)
        except ValueError as e:
            errors.append("%s:%d: %s" % (path, fence - 1, e))
            i = j + 1
            continue
        k = j + 1
        if k < len(lines) and lines[k].strip() == "```":
            end = k + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            block.expected = [(n + 1, lines[n]) for n in range(k + 1, end)]
            block.expected_line = k + 1
            j = end
        blocks.append(block)
        i = j + 1
    return blocks, errors


def skeleton(line):
    """The line's words with every run of digits as #: how an output line is matched to the
    README's (a run directory's timestamp or a version matches any; figures compare after)."""
    return " ".join(re.sub(r"\d+", "#", NUMBER.sub("#", line)).split())


def figures(line, wall):
    """(value, text, comparable) for every figure of a line, in order."""
    out = []
    for m in NUMBER.finditer(line):
        text, rest = m.group(0), line[m.end():]
        comparable = not (WALL_UNITS if wall else ALWAYS_WALL).match(rest)
        if wall and rest.startswith("%") and line[:m.start()].rstrip().endswith("MFU"):
            comparable = False  # MFU from a measured time
        out.append((float(text.replace("\u2212", "-")), text, comparable))
    return out


def compare(path, block, output):
    """One message per stale figure or missing line; [] when the output matches."""
    problems = []
    actual = output.split("\n")
    pos = 0
    for lineno, want in block.expected:
        if want.strip() == "..." or not want.strip():
            continue
        key = skeleton(want)
        at = next((n for n in range(pos, len(actual)) if skeleton(actual[n]) == key), None)
        if at is None:
            problems.append("%s:%d: no output line like this one now: %s" % (path, lineno, want.strip()))
            continue
        pos = at + 1
        got = actual[at]
        for (a, atext, comparable), (b, btext, _) in zip(figures(want, block.options["wall"]),
                                                         figures(got, block.options["wall"])):
            if not comparable:
                continue
            tol = block.options["rtol"] * abs(a)
            if abs(a - b) > tol or (tol == 0 and atext != btext and a != b):
                label = " ".join(want.split()[:2])
                problems.append("%s:%d: %s in the README, %s now (%s%s)" %
                                (path, lineno, atext, btext, label,
                                 ", rtol %g" % block.options["rtol"] if tol else ""))
    return problems


def scratch_dir(root, keep):
    d = keep or tempfile.mkdtemp(prefix="readme-check.")
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(root):
        if name in (".git", "out") or name.startswith("."):
            continue
        link = os.path.join(d, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(root, name), link)
    return d


def run_block(block, cwd, timeout):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    start = time.time()
    try:
        p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.command], cwd=cwd, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), time.time() - start
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        return 124, out + "\n(timed out after %d s)" % timeout, time.time() - start


def main():
    ap = argparse.ArgumentParser(prog="readme-check", description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default="README.md")
    ap.add_argument("--root", default=".", help="repository root (bin/, models/ ...)")
    ap.add_argument("--only", default="", help="the blocks whose ```sh fence is on these lines")
    ap.add_argument("--list", action="store_true", help="list the blocks and exit")
    ap.add_argument("--keep", help="run in DIR and keep it (default: a temporary folder, removed)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per block (default 900)")
    ap.add_argument("--quiet", action="store_true", help="print only the stale figures and the totals")
    a = ap.parse_args()
    try:
        blocks, errors = parse_readme(a.readme)
    except OSError as e:
        print("readme-check: error: %s" % e, file=sys.stderr)
        return 2
    try:
        only = {int(x) for x in a.only.split(",") if x}
    except ValueError:
        print("readme-check: error: --only takes line numbers, not '%s'" % a.only, file=sys.stderr)
        return 2
    if a.list:  # and the blocks without a marker: a README edit is checked without running
        for e in errors:
            print(e)
        for b in blocks:
            kind = "skip (%s)" % b.options["skip"] if b.options["skip"] else \
                "run" if b.options["run"] or b.expected is None else "compare"
            print("%s:%d %s: %s" % (a.readme, b.line, kind, b.command.split("\n")[0][:70]))
        return 1 if errors else 0
    passed, failed = 0, len(errors)
    for e in errors:
        print(e)
    cwd = scratch_dir(os.path.abspath(a.root), a.keep)
    try:
        for b in blocks:
            if only and b.line not in only:
                continue
            if b.options["skip"]:
                if not a.quiet:
                    print("%s:%d: skipped: %s" % (a.readme, b.line, b.options["skip"]))
                continue
            rc, out, secs = run_block(b, cwd, a.timeout)
            if a.keep:  # what it printed, to update the README from
                with open(os.path.join(cwd, "readme-check-%d.out" % b.line), "w") as f:
                    f.write(out)
            problems = []
            if rc != 0:
                tail = " | ".join(l for l in out.strip().split("\n")[-3:])
                problems.append("%s:%d: the command exited %d: %s" % (a.readme, b.line, rc, tail))
            elif b.expected is not None and not b.options["run"]:
                problems = compare(a.readme, b, out)
            for p in problems:
                print(p)
            if problems:
                failed += 1
            else:
                passed += 1
                if not a.quiet:
                    print("%s:%d: ok (%.1f s)" % (a.readme, b.line, secs))
            sys.stdout.flush()
    finally:
        if not a.keep:
            shutil.rmtree(cwd, ignore_errors=True)
    print("readme-check: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
