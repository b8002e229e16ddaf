#!/usr/bin/env python3
"""same_run.py A B N [SKIP]: run B trained as run A did. B's N losses equal A's from step
SKIP + 1 on (relative 1e-5), and B's parameters (B.params, float32) A's: 1e-4 in relative norm and
1e-4 relative + 1e-5 absolute per element. Float sums round in another order across layouts,
so not exactly (tests/cli/exec-lib.bash says what was observed). Exits 1 with the reason."""
import array, json, math, sys

a, b = sys.argv[1], sys.argv[2]
n = int(sys.argv[3])
skip = int(sys.argv[4]) if len(sys.argv) > 4 else 0
la = json.load(open(a + "/metrics.json"))["losses"][skip:]
lb = json.load(open(b + "/metrics.json"))["losses"]
assert len(la) == len(lb) == n, (la, lb)
for x, y in zip(la, lb):
    assert abs(x - y) <= 1e-5 * abs(x), ("loss", la, lb)
pa, pb = array.array("f"), array.array("f")
pa.frombytes(open(a + ".params", "rb").read())
pb.frombytes(open(b + ".params", "rb").read())
assert len(pa) == len(pb) > 0
num = sum((x - y) ** 2 for x, y in zip(pa, pb))
den = sum(x * x for x in pa)
assert math.sqrt(num / den) <= 1e-4, ("parameter norm", math.sqrt(num / den))
worst = max(abs(x - y) - 1e-4 * abs(x) for x, y in zip(pa, pb))
assert worst <= 1e-5, ("parameter element", worst)
