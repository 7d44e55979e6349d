"""Grade a run's recorded code answers again with today's extraction, without generating anything.

Why: the grade of a code answer depends on what is extracted and run (quality/execute.py); when that changes (the
model's own top-level demo no longer run, as EvalPlus's sanitizer does), the answers a run recorded can be graded
again exactly. Only first attempts: requests.jsonl keeps each answer's text, not the text of its retries (their
outcomes stay as the run graded them), so a measured retry loop is not regraded.

    python benchmarks/regrade_code.py RUN_DIR [--workload humaneval] [--load quality] [--no-prefill] [--against ARM]

--no-prefill: the run asked without an answer start (a run before EvalPlus's form was the default): each answer is
graded as its text alone.

Prints, per arm, pass@1 as recorded and as graded now, and the paired change (items that flip either way); with
--against, each arm's paired difference from that arm as graded now (the ledger's exact interval and decision,
ledger/same_quality.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specledger.bench.workload import open_workload
from specledger.errors import SpecLedgerError
from specledger.quality.execute import grade_many


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--workload", default="humaneval", help="the code workload the run asked (its prompts' starts)")
    ap.add_argument("--load", default="quality", help="the level whose records are graded again")
    ap.add_argument("--no-prefill", action="store_true", help="the run's prompts began no answer: grade the text alone")
    ap.add_argument("--against", help="an arm: every other arm's paired difference from it, graded now")
    ap.add_argument("--json", type=Path, help="write the new grades here (question id -> outcome, per arm)")
    args = ap.parse_args()
    questions = {q.question_id: q for q in open_workload(args.workload).questions}
    path = args.run_dir / "requests.jsonl"
    if not path.exists():
        raise SpecLedgerError(f"{path}: no such file (give a run directory)")
    rows = [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
    rows = [r for r in rows if r.get("load") == args.load and r.get("grade") and r.get("status") == "ok"
            and r.get("question_id") in questions and questions[r["question_id"]].code is not None]
    if not rows:
        raise SpecLedgerError(f"{path}: no graded code answers at load {args.load!r}")
    items = []
    for r in rows:
        q = questions[r["question_id"]]
        text = r.get("output_text") or ""
        answer = text if args.no_prefill else q.answer(text)
        items.append((answer, q.code))
    graded = list(grade_many(items))
    arms: dict[str, list[tuple[str, bool, bool, str]]] = defaultdict(list)
    for r, g in zip(rows, graded):
        arms[r["config"]].append((r["question_id"], bool(r["grade"].get("passed")), g.passed, g.outcome))
    t = Table(title=f"{args.run_dir}: {args.load} answers graded again")
    for col in ("arm", "items", "pass@1 recorded", "pass@1 now", "now passes / now fails"):
        t.add_column(col, justify="right")
    for arm, xs in arms.items():
        n = len(xs)
        before, after = sum(x[1] for x in xs), sum(x[2] for x in xs)
        t.add_row(arm, str(n), f"{before}/{n} = {before / n:.1%}", f"{after}/{n} = {after / n:.1%}",
                  f"{sum(x[2] and not x[1] for x in xs)} / {sum(x[1] and not x[2] for x in xs)}")
    Console().print(t)
    if args.against:
        from specledger.ledger.same_quality import decide

        if args.against not in arms:
            raise SpecLedgerError(f"--against {args.against}: no graded answers of that arm (arms: {', '.join(arms)})")
        ref = {q: float(now) for q, _, now, _ in arms[args.against]}
        for arm, xs in arms.items():
            if arm != args.against:
                print(f"{arm} against {args.against}: "
                      f"{decide(args.against, ref, arm, {q: float(now) for q, _, now, _ in xs}).note}")
    if args.json:
        args.json.write_text(json.dumps({a: {q: o for q, _, _, o in xs} for a, xs in arms.items()}, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpecLedgerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
