"""`specledger serve`: load a model and a strategy, then serve them over the OpenAI API."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from specledger.cli.decoding import parse_params
from specledger.errors import BadInput

LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "TRACE")  # (TRACE: uvicorn's)


def serve(
    model: str = typer.Option("smollm2-135m", "--model", "-m", help="Registry name, .gguf file or HF directory."),
    dtype: str = typer.Option(None, "--dtype", help="fp32 | bf16 | fp16 (default: fp32, bf16 when quantized)."),
    quant: str = typer.Option("none", "--quant", help="none | int8 | int4"),
    group_size: int = typer.Option(32, "--group-size", help="int4 group size."),
    activations: int = typer.Option(16, "--activations", help="16 | 8: bits of an activation inside the int4/int8 products (8 = llama.cpp's W4A8/W8A8: prefill and verification about 1.6x faster on AVX-512 VNNI, a little less agreement with fp32); for every quantized model served."),
    device: str = typer.Option("cpu", "--device"),
    strategy: str = typer.Option("ar", "--strategy", "-s", help="ar | lookup | draft | eagle | hier"),
    strategy_param: list[str] = typer.Option([], "--strategy-param", "-p", help="key=value, repeatable; e.g. -p draft_length=fixed: every "
                                          "sequence drafts max_nodes (the draft-size cap) every step, not the "
                                          "adaptive planner's choice."),
    draft_model: str = typer.Option(None, "--draft-model", help="Draft model for --strategy draft."),
    draft_dtype: str = typer.Option(None, "--draft-dtype"),
    draft_quant: str = typer.Option(None, "--draft-quant",
                                    help="Quantization of the draft (alone: a quantized copy of the target)."),
    intermediate_model: str = typer.Option(None, "--intermediate-model",
                                           help="Intermediate model for --strategy hier ('target' = the same file)."),
    intermediate_dtype: str = typer.Option(None, "--intermediate-dtype"),
    intermediate_quant: str = typer.Option(None, "--intermediate-quant"),
    max_seq_len: int = typer.Option(None, "--max-seq-len", help="Cap the context length (KV cache size)."),
    served_model_name: str = typer.Option(None, "--served-model-name", help="The model id clients use."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    max_queue: int = typer.Option(16, "--max-queue", help="Requests that may wait for a place in the batch."),
    max_batch: int = typer.Option(8, "--max-batch", help="Requests decoded together in one pass (1: one at a "
                                  "time, the others queued)."),
    prefill_chunk: int = typer.Option(256, "--prefill-chunk", help="Prompt tokens fed in one batched pass at most: "
                                      "smaller shortens the running requests' stalls while a prompt joins, "
                                      "at the cost of the joining request's TTFT."),
    prefix_cache: bool = typer.Option(True, "--prefix-cache/--no-prefix-cache",
                                      help="Reuse the cache of a finished request's tokens for a later prompt that "
                                      "starts with them (the next turn of a conversation), as llama-server and "
                                      "vLLM do. Not with the eagle strategy."),
    shutdown_timeout: float = typer.Option(30.0, "--shutdown-timeout", help="Seconds in-flight requests get; those "
                                           "still running are then told (a stream: an error event, then [DONE])."),
    max_body_bytes: int = typer.Option(4 * 2**20, "--max-body-bytes", help="Larger request bodies are refused (413) "
                                       "before they are read."),
    max_prompt_chars: int = typer.Option(1_000_000, "--max-prompt-chars", help="Longer prompts are refused (400) "
                                         "before they are tokenized."),
    read_timeout: float = typer.Option(30.0, "--read-timeout", help="Seconds a request's head and body may take to "
                                       "arrive; a slower one is answered 408 and its connection closed."),
    max_connections: int = typer.Option(None, "--max-connections", help="Open connections at most; more are answered "
                                        "503 at once (default: 1024, or half of what the open-file limit leaves)."),
    log_level: str = typer.Option("info", "--log-level"),
    api_key: list[str] = typer.Option([], "--api-key", help="Require this key on /v1/* (Authorization: Bearer); "
                                      "repeatable. Also: --api-key-file, SPECLEDGER_API_KEY."),
    api_key_file: Path = typer.Option(None, "--api-key-file", help="A file of accepted keys, one per line."),
    metrics_require_key: bool = typer.Option(False, "--metrics-require-key",
                                             help="Close /metrics to requests without a key too."),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (chat and completions, streaming, /metrics)."""
    from specledger.decoding.factory import STRATEGIES, check_params, make_strategy
    from specledger.engine import threads
    from specledger.engine.loader import load_model
    from specledger.server.app import Server, bind, create_app
    from specledger.server.auth import collect_keys, exposure_warning
    from specledger.server.connections import RESERVED_FDS, descriptor_limit

    # Everything that can be checked cheaply is checked before seconds go into loading models.
    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be in 0..65535 (got {port})")
    if not shutdown_timeout >= 0:  # (NaN too)
        raise BadInput(f"--shutdown-timeout must be >= 0 seconds (got {shutdown_timeout})")
    if not read_timeout > 0:  # (NaN too)
        raise BadInput(f"--read-timeout must be > 0 seconds (got {read_timeout})")
    fds = descriptor_limit()
    if max_connections is not None and fds is not None and max_connections > fds - RESERVED_FDS:
        raise BadInput(f"--max-connections {max_connections} leaves too few of the {fds} open files this process "
                       f"may have (ulimit -n): at most {fds - RESERVED_FDS}")
    if log_level.upper() not in LOG_LEVELS:
        raise BadInput(f"unknown --log-level {log_level!r} (choose from {', '.join(x.lower() for x in LOG_LEVELS)})")
    for flag, value, least in (("--max-body-bytes", max_body_bytes, 1), ("--max-prompt-chars", max_prompt_chars, 1),
                               ("--max-seq-len", max_seq_len, 2), ("--group-size", group_size, 1),
                               ("--max-queue", max_queue, 0), ("--max-batch", max_batch, 1),
                               ("--prefill-chunk", prefill_chunk, 1), ("--max-connections", max_connections, 1)):
        if value is not None and value < least:
            raise BadInput(f"{flag} must be >= {least} (got {value})")
    if strategy not in STRATEGIES:
        raise BadInput(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    params = parse_params(strategy_param, "--strategy-param")
    with_draft = bool(draft_model or draft_quant or draft_dtype)
    if with_draft and strategy != "draft":
        raise BadInput("--draft-model/--draft-quant/--draft-dtype only apply to --strategy draft")
    if strategy == "draft" and not with_draft and "draft" not in params:
        raise BadInput("--strategy draft needs --draft-model (or --draft-quant for a quantized copy of the target)")
    keys = collect_keys(api_key, api_key_file)
    if metrics_require_key and not keys:
        raise BadInput("--metrics-require-key needs a key (--api-key, --api-key-file or SPECLEDGER_API_KEY)")
    # A model role given by its flags; 'target' (the default with only a precision) is the target's own file.
    roles = {"draft": (draft_model, draft_dtype, draft_quant),
             "intermediate": (intermediate_model, intermediate_dtype, intermediate_quant)}
    for role, (m, d, q) in roles.items():
        if m or d or q:
            params[role] = {"model": m or "target", "dtype": d, "quant": q or "none", "group_size": group_size,
                            "max_seq_len": max_seq_len, "activations": activations if q not in (None, "none") else 16}
    params = check_params(strategy, params)
    sock = bind(host, port)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s: %(message)s")

    def build() -> tuple[Any, Any, Any]:  # on the torch thread, as every later op (engine/threads.py)
        lm = load_model(model, dtype=dtype, quant=quant, group_size=group_size, device=device,
                        max_seq_len=max_seq_len, activations=activations)
        strat = make_strategy(strategy, target=lm, **params)
        return lm, strat, create_app(lm, strat, served_name=served_model_name, max_queue=max_queue, api_keys=keys,
                                     metrics_require_key=metrics_require_key, max_batch=max_batch,
                                     prefill_chunk=prefill_chunk, prefix_cache=prefix_cache,
                                     max_body_bytes=max_body_bytes, max_prompt_chars=max_prompt_chars,
                                     read_timeout_s=read_timeout, max_connections=max_connections)

    lm, strat, app = threads.run(build)
    name = served_model_name or lm.name
    door = f", {len(keys)} API key{'s' if len(keys) != 1 else ''} accepted" if keys else ""
    typer.echo(f"serving {name} ({lm.label}, strategy {strat.name} {strat.params()}) "
               f"on http://{host}:{sock.getsockname()[1]}/v1{door}", err=True)
    warning = exposure_warning(host, keys)
    if warning:
        typer.echo(warning, err=True)
    Server(app, shutdown_timeout_s=shutdown_timeout, log_level=log_level.lower()).run(sockets=[sock])


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
