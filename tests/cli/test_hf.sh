#!/usr/bin/env bash
# Hugging Face weights in and out of piper-exec (--load-hf, --save-hf). A tiny Llama checkpoint
# made here (tests/cli/hf_checkpoint.py: standard library only; F32 in two shards with an index,
# BF16, F16) loads exactly: the parameters a step with learning rate 0 dumps are the
# checkpoint's, transposed from HF's [out, in], on one device and on every plan below (each rank
# reads its own TP, PP, DP and ZeRO-3 slices, and the export gathered from them is the
# checkpoint again); every name, shape or dtype mismatch, or a config.json that describes
# another model (rope_theta: what shapes cannot show), is one line,
# exit 2, naming the file and the tensor. An fp32 export reads back bit for bit; a bf16 one is
# the parameters rounded; the Python safetensors package (when importable) reads the exports'
# names, shapes and values. The first step's loss is Hugging Face Llama's, computed in numpy from
# the checkpoint (when numpy is importable). Round trip: export after one step, import on a plan and train one
# step: its loss is the loss of the second step without exporting (the data repeats one global
# batch, so both steps see the same tokens). tiny-moe's experts and router go out and back in
# through EP 2 x ZeRO-3. A 4-rank PP 2 x DP 2 fine-tune of the Llama checkpoint learns and its
# bf16 export loads again.
set -u
BIN=${PIPER_BIN:-bin}
PE="$BIN/piper-exec"
HFC="python3 tests/cli/hf_checkpoint.py"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset PIPER_EXEC_FAULT
pass=0
failed=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
MPIRUN=(mpirun --oversubscribe)

expect_bad() {
  local name=$1 want=$2; shift 2
  "$PE" "$@" >"$T/out" 2>"$T/err"
  local rc=$?
  if [ "$rc" -ne 2 ]; then bad "$name: exit $rc, want 2 ($(head -c 300 "$T/err"))"; return; fi
  if [ "$(wc -l <"$T/err")" -ne 1 ]; then bad "$name: $(wc -l <"$T/err") stderr lines: $(cat "$T/err")"; return; fi
  grep -q "^piper-exec: error: " "$T/err" || { bad "$name: no error prefix: $(cat "$T/err")"; return; }
  grep -qF -- "$want" "$T/err" || { bad "$name: message lacks '$want': $(cat "$T/err")"; return; }
  ok
}
losses() { python3 -c "import json,sys; print('\n'.join(repr(x) for x in json.load(open(sys.argv[1]))['losses']))" "$1/metrics.json"; }

echo '[]' >"$T/one.json"
$HFC make "$T/hf" "$T/llama.json" F32 2 7 || { echo "cannot make the checkpoint"; exit 1; }
$HFC expect "$T/hf" "$T/hf.expect"
M=(--model "$T/llama.json")
ONE=("${M[@]}" --directives "$T/one.json" --mbs 8 --warmup 0 --quiet --timeout 60)

# --- exact load on one device, three dtypes ------------------------------------------------
for dt in F32 BF16 F16; do
  $HFC make "$T/hf_$dt" "$T/llama_$dt.json" $dt 1 7 && $HFC expect "$T/hf_$dt" "$T/hf_$dt.expect"
  "$PE" "${ONE[@]}" --iters 1 --lr 0 --load-hf "$T/hf_$dt" --dump-params "$T/load_$dt.params" \
    --no-report >"$T/log" 2>&1 && cmp -s "$T/load_$dt.params" "$T/hf_$dt.expect" && ok ||
    bad "--load-hf $dt: parameters are not the checkpoint's: $(tail -2 "$T/log")"
done
# the initialisation is not the checkpoint (so the comparison above can fail)
"$PE" "${ONE[@]}" --iters 1 --lr 0 --dump-params "$T/init.params" --no-report >/dev/null 2>&1
cmp -s "$T/init.params" "$T/hf.expect" && bad "the initialisation equals the checkpoint" || ok

# --- mismatches: one line, exit 2, the file and the tensor -----------------------------------
mutate() { # mutate NAME PYTHON: a copy of the F32 single-file checkpoint, edited
  rm -rf "$T/$1"; cp -r "$T/hf_F32" "$T/$1"
  python3 - "$T/$1/model.safetensors" "$2" <<'EOF'
import json, struct, sys
path, edit = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h, data = json.loads(raw[8:8 + n]), raw[8 + n:]
exec(edit)
text = json.dumps(h).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)
EOF
}
mutate missing 'del h["model.layers.1.mlp.up_proj.weight"]'
expect_bad "missing tensor" 'tensor "model.layers.1.mlp.up_proj.weight" is missing' "${ONE[@]}" --iters 1 --load-hf "$T/missing"
mutate shape 'e = h["model.layers.0.self_attn.k_proj.weight"]; e["shape"] = [e["shape"][1], e["shape"][0]]'
expect_bad "wrong shape" "$T/shape/model.safetensors: tensor \"model.layers.0.self_attn.k_proj.weight\" has shape [32, 16], model llama needs [16, 32]" \
  "${ONE[@]}" --iters 1 --load-hf "$T/shape"
mutate dtype 'e = h["model.norm.weight"]; e["dtype"] = "I32"'
expect_bad "wrong dtype" 'tensor "model.norm.weight" has dtype I32' "${ONE[@]}" --iters 1 --load-hf "$T/dtype"
mutate extra 'h["model.layers.0.self_attn.q_proj.bias"] = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
expect_bad "extra tensor" 'tensor "model.layers.0.self_attn.q_proj.bias" has no place in model llama' "${ONE[@]}" --iters 1 --load-hf "$T/extra"
mutate offsets 'e = h["model.norm.weight"]; e["data_offsets"] = [0, 8]'
expect_bad "bad offsets" 'tensor "model.norm.weight": data_offsets [0, 8] do not hold its shape' "${ONE[@]}" --iters 1 --load-hf "$T/offsets"
rm -rf "$T/theta"; cp -r "$T/hf_F32" "$T/theta"
python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['rope_theta']=500000.0; json.dump(d, open(p,'w'))" "$T/theta/config.json"
expect_bad "config.json" "$T/theta/config.json: rope_theta is 500000, model llama has 10000" "${ONE[@]}" --iters 1 --load-hf "$T/theta"
# a key twice (Python's json reads the last, cJSON the first) is refused, as the model reader
# refuses it; likewise in the index
rm -rf "$T/twice"; cp -r "$T/hf_F32" "$T/twice"
# (its first key again, with the same value: read alike either way, and still refused)
key=$(python3 -c "import json,sys; p=sys.argv[1]; t=open(p).read(); k, v = next(iter(json.loads(t).items()))
open(p, 'w').write('{' + json.dumps(k) + ': ' + json.dumps(v) + ', ' + t.lstrip()[1:]); print(k)" "$T/twice/config.json")
expect_bad "config.json key twice" "$T/twice/config.json: key \"$key\" appears twice" "${ONE[@]}" --iters 1 --load-hf "$T/twice"
printf 'garbage' >"$T/garbage.safetensors"; mkdir -p "$T/garbage"; cp "$T/garbage.safetensors" "$T/garbage/model.safetensors"
expect_bad "not safetensors" "$T/garbage/model.safetensors: not a safetensors file" "${ONE[@]}" --iters 1 --load-hf "$T/garbage"
mkdir -p "$T/empty"
expect_bad "no checkpoint" "no model.safetensors.index.json and no model.safetensors" "${ONE[@]}" --iters 1 --load-hf "$T/empty"
expect_bad "another model" "$T/hf/config.json: hidden_size is 32, model tiny-dense has 64" \
  --model models/tiny-dense.json --directives "$T/one.json" --iters 1 --load-hf "$T/hf"
# ... and without its config.json, the tensors' shapes say it
rm -rf "$T/nocfg"; cp -r "$T/hf" "$T/nocfg"; rm "$T/nocfg/config.json"
expect_bad "another model's tensors" "model-00001-of-00002.safetensors: tensor \"model.embed_tokens.weight\" has shape [256, 32], model tiny-dense needs [256, 64]" \
  --model models/tiny-dense.json --directives "$T/one.json" --iters 1 --load-hf "$T/nocfg"
expect_bad "save dtype" "--save-dtype fp16: give bf16 or fp32" "${ONE[@]}" --iters 1 --save-hf "$T/x" --save-dtype fp16
expect_bad "load and resume" "--load-hf starts a run" "${ONE[@]}" --iters 1 --load-hf "$T/hf" --resume "$T/nothing" --no-report

# the index places every tensor; under mpirun the job refuses in one line (no abort)
rm -rf "$T/noidx"; cp -r "$T/hf" "$T/noidx"
python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); del d['weight_map']['model.norm.weight']; json.dump(d, open(p,'w'))" \
  "$T/noidx/model.safetensors.index.json"
timeout 120 "${MPIRUN[@]}" -np 2 "$PE" "${M[@]}" --layout pp=2 --schedule 1f1b --mbs 4 --warmup 0 --iters 1 \
  --timeout 60 --load-hf "$T/noidx" --no-report >"$T/log" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(grep -c '^piper-exec: error: ' "$T/log")" -eq 1 ] && ! grep -q MPI_ABORT "$T/log" &&
  grep -q "^piper-exec: error: $T/noidx/model.safetensors.index.json: tensor \"model.norm.weight\" is in model-00002-of-00002.safetensors, the index's weight_map says nothing" "$T/log" &&
  ok || bad "a tensor the index does not place, 2 ranks: exit $rc, $(cat "$T/log")"
rm -rf "$T/idx2"; cp -r "$T/hf" "$T/idx2"
python3 -c "import re,sys; p=sys.argv[1]; t=open(p).read(); open(p,'w').write(re.sub(r'\"weight_map\"\s*:\s*\{', '\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\", ', t, count=1))" \
  "$T/idx2/model.safetensors.index.json"
expect_bad "index key twice" "$T/idx2/model.safetensors.index.json: key \"model.norm.weight\" appears twice in \"weight_map\"" \
  "${ONE[@]}" --iters 1 --load-hf "$T/idx2"

# --- exports ------------------------------------------------------------------------------
"$PE" "${ONE[@]}" --iters 1 --lr 0 --load-hf "$T/hf" --save-hf "$T/exp32" --no-report >"$T/log" 2>&1 &&
  $HFC same "$T/hf" "$T/exp32" && ok || bad "an fp32 export after learning rate 0 is not the checkpoint: $(tail -2 "$T/log")"
"$PE" "${ONE[@]}" --iters 1 --lr 0 --load-hf "$T/hf" --save-hf "$T/exp16" --save-dtype bf16 --no-report >"$T/log" 2>&1 &&
  python3 - "$T/hf" "$T/exp16" <<'EOF' && ok || bad "a bf16 export is not the parameters rounded to bf16"
import struct, sys
sys.path.insert(0, "tests/cli")
import hf_checkpoint as h
a, b = h.read_dir(sys.argv[1]), h.read_dir(sys.argv[2])
assert sorted(a) == sorted(b)
for name, (dt, shape, v) in a.items():
    assert b[name][0] == "BF16" and b[name][1] == shape, name
    want = h.decode(b"".join(h.bf16(x) for x in v), "BF16", len(v))
    assert b[name][2] == want, name
EOF
grep -q '"torch_dtype":[[:space:]]*"bfloat16"' "$T/exp16/config.json" && ok || bad "config.json: $(cat "$T/exp16/config.json")"
if python3 -c "import safetensors.numpy, numpy" 2>/dev/null; then
  python3 - "$T/hf_F32" "$T/exp32" <<'EOF' && ok || bad "the safetensors package does not read the export"
import json, sys
from safetensors.numpy import load_file
src, got = load_file(sys.argv[1] + "/model.safetensors"), load_file(sys.argv[2] + "/model.safetensors")
assert sorted(src) == sorted(got), sorted(set(src) ^ set(got))
for k in src:
    assert got[k].shape == src[k].shape and got[k].dtype == src[k].dtype, k
    assert (got[k] == src[k]).all(), k
cfg = json.load(open(sys.argv[2] + "/config.json"))
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_size"] == 32, cfg
EOF
else
  echo "note: python3 cannot import safetensors (pip install safetensors numpy): its check skipped"
fi

# --- every plan reads its own slices -------------------------------------------------------
PLANS=("dp2 2 --layout pp=1,dp=2 --mbs 4" "pp2 2 --layout pp=2 --schedule 1f1b --mbs 8"
  "tp2 2 --layout pp=1,tp=2 --mbs 8" "pp2_dp2 4 --layout pp=2,dp=2 --schedule 1f1b --mbs 4"
  "tp2_dp2 4 --layout pp=1,dp=2,tp=2 --mbs 4" "dp2_zero3 2 --layout pp=1,dp=2,zero=3 --mbs 4")
for c in "${PLANS[@]}"; do
  set -- $c
  name=$1 np=$2; shift 2
  timeout 300 "${MPIRUN[@]}" -np $np "$PE" "${M[@]}" "$@" --warmup 0 --iters 1 --lr 0 --quiet --timeout 60 \
    --load-hf "$T/hf" --no-report --dump-params "$T/load_$name.params" --save-hf "$T/save_$name" >"$T/log" 2>&1 &&
    cmp -s "$T/load_$name.params" "$T/hf.expect" && ok || bad "$name: --load-hf parameters differ: $(tail -3 "$T/log")"
  # ... and its export, gathered from the slices, is the checkpoint
  $HFC same "$T/hf" "$T/save_$name" && ok || bad "$name: the --save-hf export is not the checkpoint"
done

# --- round trip == not exporting, on every plan --------------------------------------------
# 16 sequences of 16 tokens a step (8 micro-batches of 2) and 17 more bytes: each step reads the
# same global batch (exec/data.c wraps sequence blocks around the data)
head -c $((16 * 16 + 17)) README.md >"$T/data.bin"
D=(--data "$T/data.bin")
"$PE" "${ONE[@]}" "${D[@]}" --iters 2 --load-hf "$T/hf" --out "$T/two" >/dev/null 2>&1 &&
  "$PE" "${ONE[@]}" "${D[@]}" --iters 1 --load-hf "$T/hf" --save-hf "$T/step1" --no-report >/dev/null 2>&1 &&
  ok || bad "the runs to export from failed"
# the first step's loss is Hugging Face's Llama on those weights (numpy, float64: layout, RoPE's
# rotate_half, grouped KV heads; a model without RoPE would differ by 8e-4)
if python3 -c "import numpy" 2>/dev/null; then
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-6 * abs(a))" \
    "$($HFC loss "$T/hf" "$T/data.bin" 16 16)" "$(losses "$T/two" | sed -n 1p)" && ok ||
    bad "step 1's loss $(losses "$T/two" | head -1) is not Hugging Face Llama's $($HFC loss "$T/hf" "$T/data.bin" 16 16)"
else
  echo "note: python3 cannot import numpy: the Hugging Face reference loss is skipped"
fi
want=$(losses "$T/two" | tail -1)
# same NAME LOSS: within 1e-5 relative (data parallelism and TP sum in another order)
near() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(a))" "$1" "$2"; }
"$PE" "${ONE[@]}" "${D[@]}" --iters 1 --load-hf "$T/step1" --out "$T/rt_one" >/dev/null 2>&1 &&
  [ "$(losses "$T/rt_one")" = "$want" ] && ok || bad "one device: the loss after export + import $(losses "$T/rt_one" 2>&1) is not $want"
for c in "${PLANS[@]}"; do
  set -- $c
  name=$1 np=$2; shift 2
  timeout 300 "${MPIRUN[@]}" -np $np "$PE" "${M[@]}" "$@" "${D[@]}" --warmup 0 --iters 1 --quiet --timeout 60 \
    --load-hf "$T/step1" --out "$T/rt_$name" >"$T/log" 2>&1 && near "$want" "$(losses "$T/rt_$name")" &&
    ok || bad "$name: the loss after export + import $(losses "$T/rt_$name" 2>&1) is not $want"
done

# --- MoE: experts and router out and back in, under EP 2 x ZeRO-3 ----------------------------
MOE=(--model models/tiny-moe.json --directives "$T/one.json" --mbs 4 --warmup 0 --quiet --timeout 60 --no-report)
"$PE" "${MOE[@]}" --iters 1 --save-hf "$T/moe" --dump-params "$T/moe.params" >/dev/null 2>&1 &&
  python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n))
assert h['model.layers.1.mlp.experts.7.down_proj.weight']['shape'] == [64, 32], h['model.layers.1.mlp.experts.7.down_proj.weight']
assert h['model.layers.0.mlp.gate.weight']['shape'] == [8, 64]" "$T/moe/model.safetensors" && ok || bad "tiny-moe export"
timeout 300 "${MPIRUN[@]}" -np 4 "$PE" --model models/tiny-moe.json --base-schedule directives/base-schedules/pp2_dp2_ep2_zero3.json \
  --schedule 1f1b --ranks 2 --mbs 2 --warmup 0 --iters 1 --lr 0 --quiet --timeout 60 --no-report \
  --load-hf "$T/moe" --dump-params "$T/moe_ep.params" --save-hf "$T/moe_ep" >"$T/log" 2>&1 &&
  cmp -s "$T/moe.params" "$T/moe_ep.params" && $HFC same "$T/moe" "$T/moe_ep" && ok ||
  bad "tiny-moe through pp2_dp2_ep2_zero3: $(tail -3 "$T/log")"

# --- a tied embedding over PP 2 (the head keeps a copy): written once, read into both -------
TIED=(--model models/tiny-dense-tied.json --layout pp=2 --schedule 1f1b --mbs 8 --warmup 0 --quiet --timeout 60 --no-report)
timeout 300 "${MPIRUN[@]}" -np 2 "$PE" "${TIED[@]}" --iters 2 --save-hf "$T/tied" --dump-params "$T/tied_a.params" >"$T/log" 2>&1 &&
  timeout 300 "${MPIRUN[@]}" -np 2 "$PE" "${TIED[@]}" --iters 1 --lr 0 --load-hf "$T/tied" --dump-params "$T/tied_b.params" >>"$T/log" 2>&1 &&
  cmp -s "$T/tied_a.params" "$T/tied_b.params" &&
  python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; sys.exit('lm_head.weight' in json.loads(f.read(n)))" \
    "$T/tied/model.safetensors" && ok || bad "tied embeddings over PP 2: $(tail -3 "$T/log")"

# --- a 4-rank fine-tune (warm-up, cosine decay, clipping, held-out loss), and its export loads
# again ----------------------------------------------------------------------------------------
head -c 20000 README.md >"$T/text.bin"
tail -c 8000 README.md >"$T/val.bin"
timeout 300 "${MPIRUN[@]}" -np 4 "$PE" "${M[@]}" --layout pp=2,dp=2 --schedule 1f1b --mbs 4 --warmup 0 --iters 8 \
  --quiet --timeout 60 --data "$T/text.bin" --load-hf "$T/hf" --save-hf "$T/tuned" --save-dtype bf16 \
  --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 2 --lr-decay-style cosine --clip-grad 1.0 \
  --eval-data "$T/val.bin" --eval-every 4 --eval-iters 2 --out "$T/tune" >"$T/log" 2>&1 &&
  python3 - "$T/tune/metrics.json" <<'PY' && ok || bad "fine-tune: $(tail -3 "$T/log") losses $(losses "$T/tune" 2>&1 | tr '\n' ' ')"
import json, math, sys
m = json.load(open(sys.argv[1]))
x = m.get("extra", m)
l = m["losses"]
assert l[-1] < l[0] - 0.2, l  # it learns
lr = x["lr"]  # warm-up to the peak, then cosine to the minimum by the last step
assert abs(lr[0] - 1.5e-3) < 1e-9 and abs(lr[1] - 3e-3) < 1e-9 and abs(lr[-1] - 3e-4) < 1e-9, lr
assert all(a >= b for a, b in zip(lr[1:], lr[2:])), lr
assert x["clip_grad"] == 1.0 and all(g > 0 for g in x["grad_norm"]), x["grad_norm"]
ev = x["eval"]  # every 4 steps and after the last
assert [e["step"] for e in ev] == [4, 8] and all(math.isfinite(e["loss"]) for e in ev), ev
PY
"$PE" "${ONE[@]}" --iters 1 --lr 0 --load-hf "$T/tuned" --save-hf "$T/tuned2" --save-dtype bf16 --no-report >"$T/log" 2>&1 &&
  $HFC same "$T/tuned" "$T/tuned2" && ok || bad "the fine-tuned export does not load back: $(tail -2 "$T/log")"

echo "test_hf.sh: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
