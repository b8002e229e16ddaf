#!/usr/bin/env bash
# Every field of a plan that piper-sim or piper-exec reads is derived from the instructions or
# checked against them: each scalar field of plan.json and of the device files (every element
# of short lists; of long ones the first, middle and last and one of each kind, op and pass) is
# edited in turn (a number + 1, a flag flipped, a string changed, a null made 0), and the
# edited plan must be refused (exit 2, one `error:` line) or give exactly the untouched plan's
# result: piper-sim's trace.json, results.csv and metrics.json (its wall time aside) on a
# 4-device pp2_dp2_ep2 1F1B plan; piper-exec's losses and final parameters on a one-device plan.
# An edit of the embedded model that the instructions cannot show (rms_norm_eps, rope_theta)
# must give what piper-compile's plan for the edited model gives: the model is the plan's.
set -u
BIN=${PIPER_BIN:-bin}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1
failed=0
echo '[]' >"$T/one.json"
"$BIN/piper-compile" --model models/tiny-moe.json --directives directives/base-schedules/pp2_dp2_ep2.json \
  --schedule 1f1b --mbs 4 -o "$T/four" >/dev/null || failed=1
"$BIN/piper-compile" --model models/tiny-dense.json --directives "$T/one.json" --mbs 2 -o "$T/one" \
  >/dev/null || failed=1
cat >"$T/fields.py" <<'PY'
import json, os, glob, shutil, subprocess, sys, tempfile
tool, bin_, src = sys.argv[1], sys.argv[2], sys.argv[3]

def new_value(v):
    if isinstance(v, bool): return not v
    if isinstance(v, int): return v + 1
    if isinstance(v, float): return v * 0.5 if v else 0.5
    if isinstance(v, str): return "0x%x" % (int(v, 16) + 1) if v.startswith("0x") else v + "x"
    if v is None: return 0
    return None

def walk(f, v, path, out):
    if isinstance(v, dict):
        for k, x in v.items(): walk(f, x, path + [k], out)
    elif isinstance(v, list):
        idx = set(range(len(v))) if len(v) <= 4 else {0, len(v) // 2, len(v) - 1}
        if len(v) > 4 and isinstance(v[0], dict):
            seen = {}
            for i, x in enumerate(v): seen.setdefault((x.get("kind"), x.get("op"), x.get("pass")), i)
            idx |= set(seen.values())
        for i in sorted(idx): walk(f, v[i], path + [i], out)
    elif new_value(v) is not None:
        out.append((f, path, new_value(v)))

tmp = tempfile.mkdtemp()
def run(d):
    out = tmp + "/out"
    shutil.rmtree(out, ignore_errors=True)
    if tool == "sim":
        cmd = [bin_ + "/piper-sim", "--plans", d, "--profile", "profiles/unit.json", "--out", out,
               "--force", "--no-charts"]
    else:
        cmd = [bin_ + "/piper-exec", "--plans", d, "--iters", "2", "--warmup", "0", "--out", out,
               "--force", "--no-charts", "--quiet", "--dump-params", tmp + "/params.bin"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return r, None
    if tool == "sim":
        m = json.load(open(out + "/metrics.json"))
        m.get("simulation", {}).pop("wall_seconds", None)
        def strip(x):
            if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if k != "wall_seconds"}
            if isinstance(x, list): return [strip(v) for v in x]
            return x
        return r, (open(out + "/trace.json").read(), open(out + "/results.csv").read(), strip(m))
    losses = [l for l in r.stdout.splitlines() if "loss" in l]
    return r, (open(tmp + "/params.bin", "rb").read(), json.load(open(out + "/metrics.json")).get("losses"))

r, base = run(src)
if base is None:
    sys.exit("untouched plan: exit %d %s" % (r.returncode, r.stderr))
edits = []
for f in ["plan.json"] + sorted(os.path.basename(p) for p in glob.glob(src + "/device-*.json")):
    walk(f, json.load(open(os.path.join(src, f))), [], edits)
refused = same = bad = 0
for f, path, nv in edits:
    d = tmp + "/edited"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(src, d)
    doc = json.load(open(os.path.join(d, f)))
    o = doc
    for k in path[:-1]: o = o[k]
    o[path[-1]] = nv
    json.dump(doc, open(os.path.join(d, f), "w"), indent=1)
    r, res = run(d)
    want = base
    if f == "plan.json" and path[0] == "model" and res is not None:
        # the model is what the plan says it is: an edit the instructions cannot show (a norm's
        # epsilon, RoPE's theta) must give what the edited model's own plan gives
        json.dump(doc["model"], open(tmp + "/model.json", "w"))
        json.dump(doc["program"], open(tmp + "/program.json", "w"))
        shutil.rmtree(tmp + "/recompiled", ignore_errors=True)
        c = subprocess.run([bin_ + "/piper-compile", "--model", tmp + "/model.json", "--directives",
                            tmp + "/program.json", "-o", tmp + "/recompiled"], capture_output=True)
        want = run(tmp + "/recompiled")[1] if c.returncode == 0 else None
    lines = r.stderr.strip().split("\n")
    if r.returncode == 2 and len(lines) == 1 and "error:" in lines[0]:
        refused += 1
    elif res is not None and res == want:
        same += 1
    else:
        bad += 1
        print("FAIL: %s %s = %s: exit %d, %s" % (f, json.dumps(path), json.dumps(nv), r.returncode,
                                                 "result changed" if res else r.stderr.strip()[:200]))
shutil.rmtree(tmp)
print("plan fields (%s): %d edits, %d refused, %d unchanged, %d changed the result"
      % (tool, len(edits), refused, same, bad))
with open(sys.argv[4], "a") as counts:
    counts.write("%d %d\n" % (refused + same, bad))
sys.exit(1 if bad else 0)
PY
python3 "$T/fields.py" sim "$BIN" "$T/four" "$T/counts" || failed=$((failed + 1))
python3 "$T/fields.py" exec "$BIN" "$T/one" "$T/counts" || failed=$((failed + 1))
# one check per edit (a refusal or the same result passes); a run that could not start, one
read -r ok_sim bad_sim < <(sed -n 1p "$T/counts" 2>/dev/null || echo "0 0")
read -r ok_exec bad_exec < <(sed -n 2p "$T/counts" 2>/dev/null || echo "0 0")
pass=$((${ok_sim:-0} + ${ok_exec:-0}))
[ $((${bad_sim:-0} + ${bad_exec:-0})) -gt "$failed" ] && failed=$((${bad_sim:-0} + ${bad_exec:-0}))
echo "test_plan_fields.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
