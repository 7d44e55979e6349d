"""`specledger train-draft`: self-distil an EAGLE head for a target."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console()


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console)


def train_draft(
    model: str = typer.Option("smollm2-135m", help="target model: name, .gguf or HF directory"),
    prompts: Optional[str] = typer.Option(None, help="JSONL prompt file (default: the built-in training prompts)"),
    out: Optional[str] = typer.Option(None, help="directory for the trained head (default: ./heads/<model>)"),
    work: Optional[str] = typer.Option(None, help="directory for generated data and checkpoints (default: in the cache)"),
    epochs: int = typer.Option(10, help="passes over the generated data"),
    seed: int = typer.Option(0, help="seed for the head's initialisation, data order and noise"),
    max_tokens: int = typer.Option(192, "--max-tokens", "--max-new-tokens", help="length of the target's answers"),
    samples: int = typer.Option(1, help="answers per prompt: the first greedy, the others sampled (more data)"),
    temperature: float = typer.Option(0.8, help="temperature of the sampled answers (with --samples > 1)"),
    limit: Optional[int] = typer.Option(None, help="use only the first N prompts"),
    dtype: str = typer.Option("fp32", help="target dtype for generating the data: fp32 | bf16"),
    gen_batch: int = typer.Option(64, help="answers generated together (continuous batching)"),
    batch_tokens: int = typer.Option(1024, help="padded tokens per training step"),
    lr: float = typer.Option(1e-3, help="peak learning rate"),
    noise: float = typer.Option(0.2, help="width of the uniform noise on input features"),
    draft_vocab: int = typer.Option(8192, help="tokens the head may propose (the most frequent in the data); 0 = all"),
    labels: str = typer.Option("hard", help="cross-entropy labels: hard (the target's tokens) | soft (its distribution)"),
    unroll: int = typer.Option(1, help="training steps fed the head's own predictions (1 = EAGLE-1 only)"),
    resume: bool = typer.Option(False, "--resume", help="continue from the checkpoint in the work directory"),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: all cores)"),
) -> None:
    """Train an EAGLE draft head by self-distillation: the target answers prompts, the head learns its features."""
    import torch

    from specledger.decoding.drafters.eagle_head import save_head
    from specledger.engine.loader import load_model
    from specledger.engine.tokenizer import cache_dir
    from specledger.errors import BadInput
    from specledger.train.data import DEFAULT_PROMPTS, generate_data, read_prompts
    from specledger.train.trainer import TrainConfig, train_head

    if epochs < 1 or max_tokens < 1 or gen_batch < 1 or samples < 1 or batch_tokens < 64 or draft_vocab < 0:
        raise BadInput("epochs, max-tokens, samples and gen-batch must be >= 1, batch-tokens >= 64, draft-vocab >= 0")
    if temperature <= 0:
        raise BadInput(f"--temperature must be > 0 (got {temperature})")
    if dtype not in ("fp32", "bf16"):
        raise BadInput(f"--dtype must be fp32 or bf16 (got {dtype!r})")
    cfg = TrainConfig(epochs=epochs, lr=lr, batch_tokens=batch_tokens, noise=noise, seed=seed, draft_vocab=draft_vocab,
                      labels=labels, unroll=unroll)
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    texts = read_prompts(prompts, limit)
    with console.status(f"loading {model}"):
        lm = load_model(model, dtype=dtype)
    if lm.tokenizer is None:
        raise BadInput(f"{model} has no tokenizer; self-distillation needs its chat template")
    key = hashlib.sha1(json.dumps([lm.label, max_tokens, texts]).encode()).hexdigest()[:12]
    work_dir = Path(work) if work else cache_dir() / "train" / f"{lm.name}-{key}"
    out_dir = Path(out) if out else Path("heads") / lm.name
    console.print(f"target {lm.label}; {len(texts)} prompts; work dir {work_dir}")

    with _progress() as bar:
        task = bar.add_task("answering prompts", total=None, info="")
        meta, data = generate_data(lm, texts, work_dir / "data", max_tokens=max_tokens, batch_size=gen_batch,
                                   samples=samples, temperature=temperature, seed=seed,
                                   on_progress=lambda i, n: bar.update(task, completed=i, total=n))
    gen_s = time.perf_counter() - t0
    console.print(f"data: {meta['sequences']} sequences, {meta['response_tokens']} answer tokens "
                  f"(target answering: {meta['generation_s']:.0f} s, this run {gen_s:.0f} s)")

    if not data:
        raise BadInput(f"{work_dir / 'data'}: no training data (every prompt longer than the context?)")
    if lm.dtype != "fp32":  # train against the fp32 LM head and embeddings
        lm = load_model(model, dtype="fp32")
    with _progress() as bar:
        task = bar.add_task("training head", total=None, info="")

        def on_step(step: int, total: int, avg: dict) -> None:
            bar.update(task, completed=step, total=total,
                       info=f"loss {avg['loss']:.3f}  feat {avg['v_loss']:.3f}  ce {avg['p_loss']:.2f}  "
                            f"top1 {avg['acc']:.2f}")

        head, summary = train_head(lm, data, cfg, work_dir, resume=resume, data_key=meta["key"], on_step=on_step)
    save_head(head, out_dir)
    total_s = time.perf_counter() - t0
    info = {"command": "specledger " + " ".join(shlex.quote(a) for a in sys.argv[1:]), "target": lm.name,
            "data_dtype": dtype, "seed": seed, "prompts": str(prompts or DEFAULT_PROMPTS.name),
            "data": {k: meta[k] for k in ("sequences", "tokens", "response_tokens", "max_tokens", "samples_per_prompt",
                                           "temperature", "skipped_long_prompts")},
            "train_config": cfg.__dict__, "generation_s": meta["generation_s"],
            "generation_this_run_s": round(gen_s, 1), "train_s": summary["train_time_s"],
            "data_plus_train_s": round(meta["generation_s"] + summary["train_time_s"], 1), "total_s": round(total_s, 1),
            "threads": torch.get_num_threads(),
            **{k: summary[k] for k in ("draft_vocab", "draft_vocab_coverage", "final", "history")}}
    (out_dir / "train_info.json").write_text(json.dumps(info, indent=2) + "\n")
    fin = summary["final"].get("val") or summary["final"].get("train") or {}
    console.print(
        f"saved {out_dir}  (total {total_s / 60:.1f} min: data {gen_s:.0f} s, training {summary['train_time_s']:.0f} s; "
        f"final loss {fin.get('loss', float('nan')):.3f}, top-1 {fin.get('acc', float('nan')):.2f})"
    )


def register(app: typer.Typer) -> None:
    app.command("train-draft")(train_draft)
