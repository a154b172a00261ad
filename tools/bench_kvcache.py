"""KV-cache benchmark for notebook 08_decoder_only.

    python tools/bench_kvcache.py [--tokens 128] [--threads 1] [--repeats 2] [--json out.json]

1. Seed 001: trains the reference DecoderOnlyLM in plain PyTorch on "what is statquest <EOS>
   awesome <EOS>" and "statquest is what <EOS> awesome <EOS>" and checks that `generate`
   (greedy, with the cache) answers both prompts "awesome <EOS>".
2. Speed: times `generate` with and without the KV cache on a random 4-layer model
   (d_model 128, batch 4, prompt 16) for several numbers of generated tokens, checks that both
   give the same greedy tokens, and reports the speed-up at --tokens (goal: >= 3x).

Exit status 0 when the seed-001 prompts are answered, cached == uncached, and the speed-up at
--tokens reaches --goal; 1 otherwise. Uses the course's reference implementation
(tfscratch.reference), which the notebook's tests hold equal to the solution.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from tfscratch.reference import DecoderOnlyLM, generate, next_token_loss

VOCAB = ["what", "is", "statquest", "awesome", "<EOS>"]
EOS = VOCAB.index("<EOS>")
SENTENCES = ["what is statquest <EOS> awesome <EOS>", "statquest is what <EOS> awesome <EOS>"]


def seed_001(steps=100, seed=1):
    """Train seed 001's example; return the answers, as words, to its two prompts."""
    tokens = torch.tensor([[VOCAB.index(w) for w in s.split()] for s in SENTENCES])  # (2, 6)
    torch.manual_seed(seed)
    model = DecoderOnlyLM(len(VOCAB), 16, 2, 1, 32, max_len=16)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = next_token_loss(model(tokens), tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    out = generate(model, tokens[:, :4], max_new_tokens=5, temperature=0, eos_id=EOS)
    return [(" ".join(VOCAB[i] for i in row[:4]), " ".join(VOCAB[i] for i in row[4:]))
            for row in out.tolist()], loss.item()


def _time(fn, repeats):
    """Best wall-clock and best CPU time (this process) over `repeats` runs."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, out


def speed(lengths, repeats=2, batch=4, prompt_len=16, seed=0):
    torch.manual_seed(seed)
    model = DecoderOnlyLM(64, 128, 4, 4, 512, max_len=prompt_len + max(lengths) + 1).eval()
    prompt = torch.randint(0, 64, (batch, prompt_len))
    rows = []
    for n in lengths:
        tc, cc, a = _time(lambda: generate(model, prompt, n, temperature=0, use_cache=True), repeats)
        tu, cu, b = _time(lambda: generate(model, prompt, n, temperature=0, use_cache=False), repeats)
        rows.append({"tokens": n, "cached_s": tc, "uncached_s": tu, "speedup": tu / tc,
                     "speedup_cpu": cu / cc, "same_tokens": bool(torch.equal(a, b))})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128, help="generated tokens for the headline")
    ap.add_argument("--goal", type=float, default=3.0, help="required speed-up at --tokens")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: small models run fastest on one)")
    ap.add_argument("--repeats", type=int, default=2, help="timing repeats (best is kept)")
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    answers, loss = seed_001()
    seed_ok = all(ans == "awesome <EOS>" for _, ans in answers)
    print("seed 001 (plain PyTorch, 100 steps, final loss %.4f):" % loss)
    for q, ans in answers:
        print(f"  {q:28s} -> {ans}")
    print(f"  both prompts answered 'awesome <EOS>': {'yes' if seed_ok else 'NO'}")

    lengths = sorted({16, 32, 64, a.tokens})
    rows = speed(lengths, a.repeats)
    print(f"\nKV-cache speed-up (4 layers, d_model 128, batch 4, prompt 16; torch {torch.__version__},"
          f" {a.threads} thread(s), {platform.machine()}):")
    print(f"  {'tokens':>6} {'cached s':>9} {'uncached s':>11} {'speed-up':>9} {'(CPU time)':>11}"
          "  same tokens")
    for r in rows:
        print(f"  {r['tokens']:6d} {r['cached_s']:9.3f} {r['uncached_s']:11.3f} "
              f"{r['speedup']:8.1f}x {r['speedup_cpu']:10.1f}x  {r['same_tokens']}")
    head = next(r for r in rows if r["tokens"] == a.tokens)
    same = all(r["same_tokens"] for r in rows)
    ok = seed_ok and same and head["speedup"] >= a.goal
    print(f"\nspeed-up at {a.tokens} generated tokens: {head['speedup']:.1f}x wall-clock, "
          f"{head['speedup_cpu']:.1f}x CPU time (goal >= {a.goal:g}x) -> {'PASS' if ok else 'FAIL'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seed_001": {"answers": answers, "ok": seed_ok}, "speed": rows,
                       "speedup_at_tokens": head["speedup"], "tokens": a.tokens, "pass": ok}, f,
                      indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
