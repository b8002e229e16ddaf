#!/usr/bin/env python3
"""Regenerates the validation table: every published run of validation/runs.json simulated with
piper-sim as published, its throughput against the published one (docs/validation.md).

  tools/validate.py [--bin DIR] [--runs FILE] [--out DIR] [--check]

Writes OUT/table.md (the table the README quotes) and OUT/table.tsv (one row a run). --check
asserts the targets (dense runs within 10% of the published throughput, their median within 5%;
MoE within 20%, median 10%; the MFU of a series rising with model size as published) and exits
1 naming what misses; a run marked known_miss may miss (it is reported), but one that no longer
misses fails the check, so the mark cannot outlive the miss. Bad input: one line, exit 2.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

TARGETS = {"dense": (0.10, 0.05), "moe": (0.20, 0.10)}  # per run, median: |ratio - 1|
FLOPS = ("model", "megatron", "megatron_recompute")  # how a published FLOP rate becomes tokens
PEAK_BF16_TFLOPS = {}  # profile path -> dense bf16 peak, read from the profile itself
NEEDED = ("id", "family", "model", "seq_len", "micro_batch_size", "gpu", "profile", "gpus",
          "tp", "pp", "dp", "cp", "ep", "vp", "gbs", "recompute", "layout", "schedule",
          "microbatches", "published")


def fail_input(msg):
    print(f"validate: error: {msg}", file=sys.stderr)
    sys.exit(2)


def peak_tflops(profile):
    if profile not in PEAK_BF16_TFLOPS:
        with open(profile) as f:
            PEAK_BF16_TFLOPS[profile] = json.load(f)["device"]["peak_tflops"]["bf16"]
    return PEAK_BF16_TFLOPS[profile]


def check_config(path, run):
    """The published configuration must add up: GPUs = TP x CP x PP x DP and the global
    batch = DP x micro-batches x micro-batch size (so a typo cannot pass as a figure)."""
    for key in NEEDED:
        if key not in run:
            fail_input(f'{path}: run "{run.get("id", "?")}": missing key "{key}"')
    if run["family"] not in TARGETS:
        fail_input(f'{path}: run "{run["id"]}": "family" must be dense or moe')
    if run["tp"] * run["cp"] * run["pp"] * run["dp"] != run["gpus"]:
        fail_input(f'{path}: run "{run["id"]}": tp x cp x pp x dp is not "gpus"')
    if run["ep"] > 1 and (run["tp"] * run["dp"]) % run["ep"]:
        fail_input(f'{path}: run "{run["id"]}": "ep" must divide tp x dp')
    for key in ("model_piper", "profile_overrides"):
        if not isinstance(run.get(key, {}), dict):
            fail_input(f'{path}: run "{run["id"]}": "{key}" must be an object')
    if run["dp"] * run["microbatches"] * run["micro_batch_size"] != run["gbs"]:
        fail_input(f'{path}: run "{run["id"]}": dp x microbatches x micro_batch_size is not "gbs"')
    pub = run["published"]
    if pub.get("metric") not in ("tflops_per_gpu", "mfu", "tokens_per_s_per_gpu"):
        fail_input(f'{path}: run "{run["id"]}": "published.metric" must be tflops_per_gpu, mfu '
                   'or tokens_per_s_per_gpu')
    if pub.get("flops", "model") not in FLOPS or not pub.get("source"):
        fail_input(f'{path}: run "{run["id"]}": "published" needs "source" and "flops" '
                   '(model, megatron or megatron_recompute)')


def megatron_flops_per_token(cfg, seq, recompute):
    """Korthikanti et al. 2022 (model FLOPs, no recomputation): 72 B s l h^2
    (1 + s/(6h) + V/(12 l h)) an iteration of B sequences of s tokens; Narayanan et al. 2021,
    Eq. 3, which counts full recomputation's second forward: 96 B s l h^2 (1 + s/(6h) +
    V/(16 l h))."""
    h = cfg["n_embd"] if "n_embd" in cfg else cfg["hidden_size"]
    layers = cfg["n_layer"] if "n_layer" in cfg else cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    if recompute:
        return 96.0 * layers * h * h * (1 + seq / (6.0 * h) + vocab / (16.0 * layers * h))
    return 72.0 * layers * h * h * (1 + seq / (6.0 * h) + vocab / (12.0 * layers * h))


def merge(base, over):
    """over's keys into base, objects merged key by key (a profile section's one key)."""
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v


def run_profile(run, tmp):
    """The profile the run is simulated on: the bundled one, or a copy with the run's
    profile_overrides (what the publisher's software did that the device profile does not say:
    Megatron-Bridge's force-balanced routing, DeepSeek's DeepEP dispatcher), each stated in the
    run's "unpublished" or source text, none a cost parameter fitted to the figure."""
    over = run.get("profile_overrides")
    if not over:
        return run["profile"]
    with open(run["profile"]) as f:
        prof = json.load(f)
    merge(prof, over)
    path = os.path.join(tmp, run["id"] + "-profile.json")
    with open(path, "w") as f:
        json.dump(prof, f)
    return path


def simulate(binary, run, tmp):
    with open(run["model"]) as f:
        cfg = json.load(f)
    cfg.setdefault("piper", {})
    merge(cfg["piper"], run.get("model_piper", {}))
    cfg["piper"]["seq_len"] = run["seq_len"]
    cfg["piper"]["micro_batch_size"] = run["micro_batch_size"]
    cfg["piper"]["name"] = os.path.splitext(os.path.basename(run["model"]))[0]
    model = os.path.join(tmp, run["id"] + ".json")
    with open(model, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(tmp, run["id"])
    cmd = [os.path.join(binary, "piper-sim"), "--model", model, "--profile", run_profile(run, tmp),
           "--layout", run["layout"], "--schedule", run["schedule"],
           "--mbs", str(run["microbatches"]), "--no-charts", "--no-sensitivity", "--quiet",
           "--out", out, "--force"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"validate: error: {run['id']}: piper-sim failed: {proc.stderr.strip()}",
              file=sys.stderr)
        sys.exit(1)
    with open(os.path.join(out, "metrics.json")) as f:
        return cfg, json.load(f)


def row_for(binary, run, tmp):
    cfg, met = simulate(binary, run, tmp)
    peak = peak_tflops(run["profile"])
    pub = run["published"]
    tokens = met["tokens_per_iteration"]
    kind = pub.get("flops", "model")
    if kind == "model":
        flops_token = met["model_flops_per_iteration"] / tokens
    else:
        flops_token = megatron_flops_per_token(cfg, run["seq_len"], kind == "megatron_recompute")
    if pub["metric"] == "tokens_per_s_per_gpu":
        pub_tokens = pub["value"]
    else:
        tflops = pub["value"] * peak if pub["metric"] == "mfu" else pub["value"]
        pub_tokens = tflops * 1e12 / flops_token
    sim_tokens = met["throughput_tokens_per_s"] / met["n_devices"]
    return {
        "run": run, "sim_tokens": sim_tokens, "pub_tokens": pub_tokens,
        "ratio": sim_tokens / pub_tokens,
        # utilisation on the publisher's FLOP count (for Narayanan et al. that counts the
        # recomputed forward), so the two columns compare like with like
        "sim_mfu": sim_tokens * flops_token / (peak * 1e12),
        "pub_mfu": pub_tokens * flops_token / (peak * 1e12),
        "iteration_s": met["iteration_time_s"],
        "peak_gib": met["peak_memory_bytes_max"] / 2**30,
    }


def config_text(run):
    parts = [f"TP {run['tp']}", f"PP {run['pp']}", f"DP {run['dp']}"]
    if run["cp"] > 1:
        parts.append(f"CP {run['cp']}")
    if run["ep"] > 1:
        parts.append(f"EP {run['ep']}")
    if run["vp"] > 1:
        parts.append(f"VP {run['vp']}")
    parts.append(f"mbs {run['micro_batch_size']}")
    parts.append(f"seq {run['seq_len']}")
    parts.append(f"GBS {run['gbs']}")
    parts.append(f"recompute {run['recompute']}")
    fp8 = run.get("model_piper", {}).get("fp8")
    parts.append(f"FP8 {fp8}" if fp8 else "BF16")
    return ", ".join(parts)


def write_tables(rows, pending, out):
    with open(os.path.join(out, "table.tsv"), "w") as f:
        f.write("id\tfamily\tseries\tgpus\tgpu\tpublished_tokens_s_gpu\tsimulated_tokens_s_gpu"
                "\tratio\tpublished_mfu\tsimulated_mfu\tpeak_gib\tknown_miss\n")
        for r in rows:
            run = r["run"]
            f.write(f"{run['id']}\t{run['family']}\t{run.get('series', '')}\t{run['gpus']}\t"
                    f"{run['gpu']}\t{r['pub_tokens']:.1f}\t{r['sim_tokens']:.1f}\t"
                    f"{r['ratio']:.3f}\t{r['pub_mfu']:.4f}\t{r['sim_mfu']:.4f}\t"
                    f"{r['peak_gib']:.1f}\t{1 if run.get('known_miss') else 0}\n")
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("| run | GPUs | configuration | published | simulated | ratio | source |\n")
        f.write("|---|---|---|---|---|---|---|\n")
        for r in rows:
            run = r["run"]
            f.write(f"| {run['id']} | {run['gpus']} {run['gpu']} | {config_text(run)} | "
                    f"{r['pub_tokens']:.0f} tok/s/GPU (MFU {100 * r['pub_mfu']:.1f}%) | "
                    f"{r['sim_tokens']:.0f} (MFU {100 * r['sim_mfu']:.1f}%) | "
                    f"{r['ratio']:.3f} | {run['published']['source']} |\n")
        if pending:
            f.write("\nPending (not expressible yet):\n\n")
            for p in pending:
                f.write(f"- {p['id']}: {p['reason']}\n")


def check(rows, known):
    """The target misses not marked known, and the marks that no longer hold (empty: pass).
    A run's mark is its known_miss; an aggregate's (a family's median, a step of a series) is
    an entry of runs.json's known_misses under the name this prints."""
    found = {}  # name -> message
    for family, (per_run, median) in TARGETS.items():
        fam = [r for r in rows if r["run"]["family"] == family]
        for r in fam:
            if abs(r["ratio"] - 1) > per_run:
                found[r["run"]["id"]] = f"ratio {r['ratio']:.3f} outside 1 +- {per_run}"
            if r["run"].get("known_miss"):
                known = dict(known, **{r["run"]["id"]: r["run"]["known_miss"]})
        if fam:
            med = statistics.median(r["ratio"] for r in fam)
            if abs(med - 1) > median:
                found[f"{family} median"] = f"{med:.3f} outside 1 +- {median}"
    # within a series, simulated MFU must rise (or fall) with model size as the published does
    series = {}
    for r in rows:
        if r["run"].get("series_order") is not None:
            series.setdefault(r["run"]["series"], []).append(r)
    for name, rs in series.items():
        rs.sort(key=lambda r: r["run"]["series_order"])
        for a, b in zip(rs, rs[1:]):
            if (b["pub_mfu"] > a["pub_mfu"]) != (b["sim_mfu"] > a["sim_mfu"]):
                found[f"{name}: {a['run']['id']} -> {b['run']['id']}"] = (
                    f"published MFU {100 * a['pub_mfu']:.1f}% -> {100 * b['pub_mfu']:.1f}%, "
                    f"simulated {100 * a['sim_mfu']:.1f}% -> {100 * b['sim_mfu']:.1f}%")
    misses = [f"{k}: {v}" for k, v in found.items() if k not in known]
    stale = [f"{k}: marked known but within target now: drop the mark" for k in known
             if k not in found]
    for k, v in found.items():
        if k in known:
            print(f"known miss: {k}: {v}")
    return misses + stale


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("PIPER_BIN", "bin"))
    ap.add_argument("--runs", default="validation/runs.json")
    ap.add_argument("--out", default="validation")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--only", help="comma-separated run ids (default: all)")
    args = ap.parse_args()
    try:
        with open(args.runs) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        fail_input(f"{args.runs}: {e}")
    runs = spec.get("runs", [])
    for run in runs:
        check_config(args.runs, run)
    if args.only:
        keep = set(args.only.split(","))
        runs = [r for r in runs if r["id"] in keep]
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row_for(args.bin, run, tmp) for run in runs]
    write_tables(rows, spec.get("pending", []), args.out)
    for r in rows:
        mark = "  (known miss)" if r["run"].get("known_miss") else ""
        print(f"{r['run']['id']:<24} published {r['pub_tokens']:9.1f} tok/s/GPU  simulated "
              f"{r['sim_tokens']:9.1f}  ratio {r['ratio']:.3f}  MFU {100 * r['pub_mfu']:.1f}% / "
              f"{100 * r['sim_mfu']:.1f}%{mark}")
    for family in TARGETS:
        fam = [r["ratio"] for r in rows if r["run"]["family"] == family]
        if fam:
            print(f"{family}: {len(fam)} runs, ratios {min(fam):.3f}-{max(fam):.3f}, "
                  f"median {statistics.median(fam):.3f}")
    print(f"wrote {args.out}/table.md, {args.out}/table.tsv")
    if args.check:
        known = spec.get("known_misses", {}) if not args.only else None
        if known is None:
            fail_input("--check needs every run (not --only)")
        misses = check(rows, known)
        for m in misses:
            print(f"MISS: {m}")
        if misses:
            sys.exit(1)


if __name__ == "__main__":
    main()
