"""Which retry policy rescues a code arm's failures? One retry of each failed task under each policy, side by side.

Why: a measured retry loop (bench/retry.py) prices what its retries did, so a policy that rescues nothing only adds
cost and matrix time. S27's loop (the failed answer and the failing test as the next turns, the answer begun again)
rescued 1-2 tasks per arm: the model mostly wrote the failed answer again. This asks each task a recorded run failed
at its first attempt, first greedily again (the failed answer the feedback policies carry), then once per policy:

- fresh: the same prompt, sampled at the temperature (the recipe's `feedback: false`)
- feedback: the failed answer and the failing test as the next turns, the answer begun again (`feedback: true`)
- feedback-chat: the same turns, the answer not begun (a free chat answer, its code block extracted)

    python benchmarks/retry_policies.py examples/qwen-coder-humaneval.yaml --arm ar-1.5b-w4 --failed-from RUN_DIR \
        [--policies fresh,feedback-chat] [--concurrency 16]

Prints first which policy rescued most and whether the paired exact McNemar test on the same tasks shows it
(ledger/paired.py), then, per policy, tasks rescued, the retries that failed the same way as the first answer,
output tokens and service seconds (end - start of each request, batched with the others: compare them between
policies only).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specledger.bench.backends.make import make_backend
from specledger.bench.retry import answer_sampling, feedback_turns, grade_answer, retry_sampling
from specledger.bench.workload import load_workload
from specledger.errors import SpecLedgerError
from specledger.ledger.paired import mcnemar
from specledger.quality.graders import GradeResult
from specledger.records.config import QUALITY_LEVEL, RetrySettings, load_run_config
from specledger.records.question import Question
from specledger.records.results import read_requests

POLICIES = ("fresh", "feedback", "feedback-chat")


def failed_tasks(run_dir: Path, arm: str) -> set[str]:
    """The question ids the arm failed at its first graded attempt, from the run's quality level."""
    return {r.question_id for r in read_requests(run_dir)
            if r.config == arm and r.load == QUALITY_LEVEL and r.task_attempts and not r.task_attempts[0].passed}


def retry_turns(policy: str, q: Question, messages: list[dict[str, str]], failed: str,
                grade: GradeResult) -> tuple[list[dict[str, str]], Question]:
    """What the retry sends, and the question as it grades the retry (a free chat answer: no answer start)."""
    if policy == "fresh":
        return q.sent(messages), q
    turns = feedback_turns(q, messages, failed, grade)
    if policy == "feedback":
        return q.sent(turns), q
    return turns, dataclasses.replace(q, prefill=None, stop=())


async def run(args: argparse.Namespace) -> dict[str, dict]:
    cfg = load_run_config(args.config)
    bc = next((c for c in cfg.configs if c.name == args.arm), None)
    if bc is None:
        raise SpecLedgerError(f"no arm {args.arm!r} in {args.config}")
    if not (args.failed_from / "requests.jsonl").is_file():
        raise SpecLedgerError(f"{args.failed_from} holds no requests.jsonl: give a run directory")
    failed = failed_tasks(args.failed_from, args.arm)
    if not failed:
        raise SpecLedgerError(f"{args.arm} failed no graded task at its first attempt in {args.failed_from}")
    qs = [q for q in load_workload(args.workload) if q.question_id in failed]
    print(f"{len(qs)} tasks {args.arm} failed at its first attempt in {args.failed_from}", flush=True)
    policy = RetrySettings(attempts=2, temperature=args.temperature, top_p=args.top_p, seed=0)
    backend = make_backend(bc, in_flight=args.concurrency)
    await backend.start()
    gate = asyncio.Semaphore(args.concurrency)
    stats: dict[str, dict] = {p: dict(rescued=0, same=0, tokens=0, service_s=0.0, grades={}) for p in args.policies}

    async def task(i: int, q: Question) -> None:
        async with gate:
            messages = ([{"role": "system", "content": q.system}] if q.system else []) + \
                [{"role": "user", "content": q.turns[-1]}]
            first = await backend.complete(q.sent(messages), max_tokens=bc.max_tokens,
                                           sampling=answer_sampling(bc.sampling, q))
            g = await grade_answer(q, [q.answer(first.text)], None)
            for p in args.policies:
                sent, graded_as = retry_turns(p, q, messages, first.text, g)
                sampling = retry_sampling(answer_sampling(bc.sampling, graded_as), policy, i, 2)
                c = await backend.complete(sent, max_tokens=bc.max_tokens, sampling=sampling)
                r = await grade_answer(graded_as, [graded_as.answer(c.text)], None)
                s = stats[p]
                s["rescued"] += int(bool(r.passed))
                s["grades"][q.question_id] = float(bool(r.passed))
                s["same"] += int(not r.passed and r.detail == g.detail)
                s["tokens"] += c.output_tokens or 0
                s["service_s"] += c.end - c.start
            print(f"{q.question_id}: " + ", ".join(f"{p} {s['rescued']}" for p, s in stats.items()), flush=True)

    try:
        await asyncio.gather(*(task(i, q) for i, q in enumerate(qs)))
    finally:
        await backend.close()
    return {p: {**s, "tasks": len(qs)} for p, s in stats.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", type=Path, help="the run configuration holding the arm")
    ap.add_argument("--arm", required=True)
    ap.add_argument("--failed-from", type=Path, required=True, help="a run directory with the arm's quality level")
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--policies", default="fresh,feedback,feedback-chat")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if unknown := [p for p in args.policies if p not in POLICIES]:
        print(f"unknown policy {unknown[0]!r}: choose from {', '.join(POLICIES)}", file=sys.stderr)
        return 2
    try:
        stats = asyncio.run(run(args))
    except SpecLedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    best = max(stats, key=lambda p: stats[p]["rescued"])
    tests = [mcnemar(best, stats[best]["grades"], p, s["grades"]) for p, s in stats.items() if p != best]
    Console().print(f"[bold]asked {best}, one retry rescued most: {stats[best]['rescued']} of "
                    f"{stats[best]['tasks']} tasks[/bold]"
                    + "".join(f"; against {t.config_b} {t.a_only} vs {t.b_only} tasks rescued by one only, exact "
                              f"McNemar p={t.p_value:.2g}" + (" (shown)" if t.p_value < 0.05 else " (not shown)")
                              for t in tests))
    t = Table(title=f"one retry of each failed task, {args.arm}, temperature {args.temperature}")
    for col in ("policy", "rescued", "failed as before", "output tokens", "service s"):
        t.add_column(col)
    for p, s in stats.items():
        t.add_row(p, f"{s['rescued']}/{s['tasks']}", str(s["same"]), f"{s['tokens']:,}", f"{s['service_s']:.0f}")
    Console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
