"""How good is an EAGLE head, apart from speed: teacher-forced agreement and τ per tree shape.

For each head: (1) the fp32 target answers the first `--questions` built-in questions greedily; the head,
fed the target's true features, predicts each next answer token — top-1 agreement and the feature
SmoothL1, the training loss's terms, on prompts outside the training set; (2) τ of EagleTree on the bf16
target (greedy, one built-in question per task kind) for a few tree shapes.

    python benchmarks/eagle_head_eval.py [--head DIR ...] [--questions 24] [--new-tokens 96]

Without --head, the shipped head. Several heads are evaluated on identical data.
"""

from __future__ import annotations

import argparse

import torch

from specledger.records.question import KINDS
from specledger.bench.workload import load_workload
from specledger.decoding.drafters.eagle import EagleTree, resolve_head
from specledger.decoding.loop.generate import generate
from specledger.decoding.sampling import SamplingParams
from specledger.engine.loader import load_model
from specledger.train.data import answer_stream
from specledger.train.trainer import TrainConfig, collate, head_loss

SHAPES = [(1, 1, 1), (10, 5, 20), (10, 3, "auto"), (10, 6, 60)]  # (top_k, depth, total nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", action="append", default=None, help="head directory (repeatable; default: shipped)")
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    heads = a.head or [None]
    fp32, bf16 = load_model("smollm2-135m"), load_model("smollm2-135m", dtype="bf16")
    qs = load_workload("builtin", per_category=None)
    chat = [fp32.tokenizer.chat([{"role": "user", "content": q.turns[0]}]) for q in qs]
    first = {}
    for q, ids in zip(qs, chat):
        first.setdefault(q.kind, ids)
    per_kind = [first[k] for k in KINDS if k in first]
    got = dict(answer_stream(fp32, chat[: a.questions], a.new_tokens, a.questions))
    samples = [got[i] for i in range(len(got))]
    batch = collate(samples, list(range(len(samples))))
    cfg = TrainConfig(unroll=1, noise=0.0)
    print(f"{len(samples)} questions, {int(batch.mask.sum())} answer positions; tau on bf16 over {len(per_kind)} "
          f"questions (one per kind), {a.new_tokens} new tokens, greedy")
    for h in heads:
        head, src = resolve_head(fp32, h, torch.float32)
        head.eval()
        with torch.no_grad():
            _, st = head_loss(head, fp32, batch, cfg)
        taus = []
        for k, d, n in SHAPES:
            s = EagleTree(bf16, head=h, top_k=k, depth=d, max_nodes=n)
            rs = [generate(s, ids, SamplingParams(max_tokens=a.new_tokens)) for ids in per_kind]
            taus.append(sum(r.appended for r in rs) / sum(r.steps for r in rs))
        shapes = "  ".join(f"tau(k{k},d{d},n{n}) {t:.2f}" for (k, d, n), t in zip(SHAPES, taus))
        print(f"{src}: top-1 {st['acc']:.3f}  feature SmoothL1 {st['v_loss']:.3f}  {shapes}", flush=True)


if __name__ == "__main__":
    main()
