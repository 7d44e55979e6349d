"""CLI: `specledger bench`, `specledger show RUN_DIR`, `specledger diff RUN_A RUN_B`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
import yaml
from rich.console import Console

from specledger.records.config import RunConfig, load_run_config, parse_run_config
from specledger.errors import BadInput


def _floats(text: str | None, what: str) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--{what}: expected numbers separated by commas, got {text!r}") from None


def _input_sweep(text: str, workload: str | None, per_category: int | None) -> tuple[str, None]:
    """--input-tokens 1024,4096 as the synthetic workload of those lengths (workload/synthetic.py), n each."""
    if workload is not None:
        raise BadInput("give --workload or --input-tokens, not both")
    lengths = [int(x) for x in _floats(text, "input-tokens") or []]
    if not lengths or min(lengths) < 1:
        raise BadInput(f"--input-tokens: expected prompt lengths >= 1 separated by commas, got {text!r}")
    return f"synthetic:in={'+'.join(map(str, lengths))},out=32,n={per_category or 1}", None


def _params(items: list[str], strategy: str) -> dict[str, Any]:
    """KEY=VALUE for every strategy, or STRATEGY.KEY=VALUE for one; values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise BadInput(f"--param {item!r}: expected KEY=VALUE or STRATEGY.KEY=VALUE")
        key, value = item.split("=", 1)
        if "." in key:
            owner, key = key.split(".", 1)
            if owner != strategy:
                continue
        elif strategy == "ar":
            continue
        out[key.strip()] = yaml.safe_load(value)
    return out


def model_roles(**given: tuple[str | None, str | None, str | None]) -> dict[str, dict[str, Any]]:
    """{role: {model, dtype, quant}} for each role given a model, a precision or a quantization (the model then
    'target': the target's own file)."""
    out: dict[str, dict[str, Any]] = {}
    for role, (model, dtype, quant) in given.items():
        if model is None and dtype is None and quant is None:
            continue
        out[role] = {"model": model or "target"} | ({"dtype": dtype} if dtype else {}) | \
            ({"quant": quant} if quant else {})
    return out


def build_config(
    config_file: Path | None, *, strategies: list[str], backend: str, model: str | None, dtype: str, quant: str,
    group_size: int, params: list[str], max_tokens: int, temperature: float, seed: int, base_url: str | None,
    api: str, tokenizer: str | None, retries: int | None, timeout: float | None, connect_timeout: float | None,
    overrides: dict[str, Any], api_key_env: str | None = None, server: str | None = None,
    roles: dict[str, dict[str, Any]] | None = None,
) -> RunConfig:
    """`roles`: a model per role (draft, intermediate: {model, dtype, quant}) for the strategies that use it."""
    from specledger.decoding.params import PARAMS, unused_role

    roles = roles or {}
    if config_file is not None:
        data = load_run_config(config_file).model_dump(mode="json", exclude_unset=True)
        source = str(config_file)
    else:
        configs = []
        for s in strategies or ["ar"]:
            c: dict[str, Any] = {"name": s, "backend": backend, "strategy": s, "dtype": dtype, "quant": quant,
                                 "group_size": group_size, "params": _params(params, s),
                                 "max_tokens": max_tokens,
                                 "sampling": {"temperature": temperature, "seed": seed}}
            if model:
                c["model"] = model
            c.update({role: spec for role, spec in roles.items() if role in PARAMS[s].roles})
            if backend == "openai":
                o: dict[str, Any] = {"api": api}
                for k, v in (("base_url", base_url), ("tokenizer", tokenizer), ("retries", retries),
                             ("timeout_s", timeout), ("connect_timeout_s", connect_timeout),
                             ("api_key_env", api_key_env)):
                    if v is not None:
                        o[k] = v
                if server:
                    o["server"] = {"command": server}
                c["openai"] = o
            configs.append(c)
        data = {"configs": configs, "seed": seed}
        source = "command line"
        for role in roles:
            if not any(role in PARAMS[s].roles for s in strategies if s in PARAMS):
                raise BadInput(unused_role((strategies or ["ar"])[0], role))
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *path, last = dotted.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    chosen = [k for k in ("concurrency", "rate", "replay") if overrides.get(f"load.{k}")]
    for k in ("concurrency", "rate", "replay"):
        if chosen and k not in chosen:
            data.setdefault("load", {}).pop(k, None)
    return parse_run_config(data, source=source)


def register(app: typer.Typer) -> None:
    @app.command("import")
    def import_results(
        fmt: str = typer.Argument(..., metavar="FORMAT", help="vllm-bench (a `vllm bench serve --save-result` JSON), guidellm (its JSON "
                                 "report), aiperf (profile_export.jsonl or its artifact directory)"),
        file: Path = typer.Argument(..., help="the tool's result file"),
        run_dir: Optional[Path] = typer.Option(None, help="run directory to create (default: runs/<file name>)"),
        name: Optional[str] = typer.Option(None, help="configuration name (default: label/backend + model)"),
    ) -> None:
        """Turn another tool's benchmark results into a run directory the ledger and report read."""
        from specledger.bench.importers import import_vllm_bench
        from specledger.bench.peer_imports import import_aiperf, import_guidellm
        from specledger.bench.tables import print_run

        readers = {"vllm-bench": import_vllm_bench, "guidellm": import_guidellm, "aiperf": import_aiperf}
        if fmt not in readers:
            raise BadInput(f"import: unknown format {fmt!r} (known: {', '.join(readers)})")
        target = run_dir or Path("runs") / file.stem
        run = readers[fmt](file, target, name=name)
        print_run(run)
        Console().print(f"results: {target}")

    @app.command("bench")
    def bench(
        config_file: Optional[Path] = typer.Argument(None, help="run configuration (YAML or TOML); else the flags"),
        strategy: list[str] = typer.Option([], "--strategy", "-s", help="one configuration per strategy (repeat)"),
        backend: str = typer.Option("inprocess", help="inprocess | openai"),
        model: Optional[str] = typer.Option(None, help="model name/path (openai: the served model's name)"),
        dtype: str = typer.Option("fp32", help="fp32 | bf16 | fp16"),
        quant: str = typer.Option("none", help="none | int8 | int4"),
        group_size: int = typer.Option(32, help="int4 group size"),
        draft_model: Optional[str] = typer.Option(None, help="draft strategy: the draft model (name/path; 'target' = "
                                                  "the same file, the default when --draft-quant/--draft-dtype is "
                                                  "given)"),
        draft_dtype: Optional[str] = typer.Option(None, help="precision of the draft model: fp32 | bf16 | fp16"),
        draft_quant: Optional[str] = typer.Option(None, help="quantization of the draft model: none | int8 | int4"),
        intermediate_model: Optional[str] = typer.Option(None, help="hier strategy: the intermediate model ('target' "
                                                         "= the same file, the default when --intermediate-quant/"
                                                         "--intermediate-dtype is given)"),
        intermediate_dtype: Optional[str] = typer.Option(None, help="precision of the intermediate model"),
        intermediate_quant: Optional[str] = typer.Option(None, help="quantization of the intermediate model"),
        param: list[str] = typer.Option([], "--param", "-p", help="strategy parameter KEY=VALUE or STRATEGY.KEY=VALUE; e.g. "
                                                   "draft_length=fixed (K drafted every step) | adaptive (planned, "
                                                   "the default)"),
        max_tokens: int = typer.Option(128, "--max-tokens", "--max-new-tokens", help="per answer (a workload's own limit wins)"),
        temperature: float = typer.Option(0.0, help="0 = greedy"),
        seed: int = typer.Option(0),
        workload: Optional[str] = typer.Option(
            None, help="builtin | builtin-quick | synthetic:in=..,out=..,n=.. | humaneval (once fetched: "
                       "`specledger workloads --fetch humaneval`) | PATH (format detected) | FORMAT:PATH with FORMAT "
                       "spec-bench, sharegpt, chat, csv, text, trace or code"),
        input_tokens: Optional[str] = typer.Option(
            None, "--input-tokens", metavar="N[,N...]",
            help="a long-input workload: synthetic transcripts to summarise of these prompt lengths (tokens, chat "
                 "template included), 32 tokens out, --per-category prompts of each (default 1); TTFT against "
                 "input length is a curve in the report"),
        category: list[str] = typer.Option([], "--category", help="only these categories (repeat)"),
        per_category: Optional[int] = typer.Option(None, help="sample this many questions per category"),
        sample: Optional[int] = typer.Option(None, help="a seeded random sample of N questions (streams big files)"),
        limit: Optional[int] = typer.Option(None, help="first N questions"),
        on_bad_line: Optional[str] = typer.Option(None, help="stop | skip a malformed workload line"),
        kind: Optional[str] = typer.Option(None, help="task kind of records without one (default multi_turn)"),
        prompt_column: Optional[str] = typer.Option(None, help="CSV: the column holding the prompt"),
        grader: Optional[str] = typer.Option(None, help="user grader module:function"),
        retry_attempts: Optional[int] = typer.Option(None, "--retry-attempts", min=1,
                                                     help="a measured retry loop: a failed graded answer is asked "
                                                          "again, up to N attempts in all (see retry: in a config)"),
        retry_feedback: Optional[bool] = typer.Option(None, "--retry-feedback/--no-retry-feedback",
                                                      help="with --retry-attempts: the grader's message (a failing "
                                                           "test) goes into the next attempt's prompt"),
        concurrency: Optional[str] = typer.Option(None, help="closed loop, e.g. 1,4,16"),
        rate: Optional[str] = typer.Option(None, help="open loop Poisson arrivals (requests/s), e.g. 0.5,1"),
        replay: Optional[str] = typer.Option(None, help="replay a trace's arrival times at these speeds, e.g. 1,4"),
        num_requests: Optional[int] = typer.Option(None, help="conversations per load level"),
        warmup: Optional[int] = typer.Option(None, help="warm-up conversations (not counted)"),
        slo_ttft: Optional[float] = typer.Option(None, help="TTFT objective (s) for goodput"),
        slo_tpot: Optional[float] = typer.Option(None, help="TPOT objective (s)"),
        slo_e2e: Optional[float] = typer.Option(None, help="end-to-end objective (s)"),
        base_url: Optional[str] = typer.Option(None, help="openai backend: server URL"),
        server: Optional[str] = typer.Option(None, help="openai backend: a server command to start on a free port and "
                                             "stop afterwards, e.g. '{llama_server} -m {model_path} --port {port} "
                                             "--metrics' (placeholders: host port model model_path python run_dir "
                                             "llama_server)"),
        api: str = typer.Option("chat", help="openai backend: chat | completions"),
        tokenizer: Optional[str] = typer.Option(None, help="openai backend: tokenizer to count tokens"),
        retries: Optional[int] = typer.Option(None, help="openai backend: retries per request"),
        timeout: Optional[float] = typer.Option(None, help="openai backend: per request timeout (s)"),
        connect_timeout: Optional[float] = typer.Option(None, help="openai backend: wait for the server (s)"),
        api_key_env: Optional[str] = typer.Option(None, help="openai backend: environment variable holding the "
                                                  "server's API key (sent as Authorization: Bearer)"),
        output_dir: Optional[str] = typer.Option(None, help="where run directories go"),
        run_id: Optional[str] = typer.Option(None, help="name of the run directory"),
        bootstrap: Optional[int] = typer.Option(None, help="bootstrap resamples for CIs"),
        resume: Optional[Path] = typer.Option(None, help="continue the interrupted run in this directory"),
        drop: list[str] = typer.Option([], "--drop", metavar="ARM",
                                       help="with --resume: go on without this arm (repeatable); its records stay "
                                            "in requests.jsonl, unread, and the run is priced without it"),
        no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
        repeats: Optional[int] = typer.Option(None, "--repeats", min=1, help="passes over the workload per load level"),
        interleave: Optional[bool] = typer.Option(None, "--interleave/--no-interleave",
                                                  help="run configurations request by request in random block "
                                                       "order (default) or one after another"),
        threads: Optional[int] = typer.Option(None, "--threads", min=1,
                                              help="torch threads for in-process configurations (default: chosen "
                                                   "by a short probe at 1, 2, ... threads; recorded)"),
        sustain: Optional[str] = typer.Option(None, "--sustain", metavar="DURATION",
                                              help="hold each load level until its throughput is steady or "
                                                   "DURATION (e.g. 300, 5m) ends; reports burst vs steady state"),
        cpu_watts: Optional[float] = typer.Option(None, "--cpu-watts", min=0.001,
                                                  help="power of one busy logical CPU (W) for the energy estimate "
                                                       "where the machine has no RAPL/NVML counter (default: a "
                                                       "table of known CPUs); marked 'estimated'"),
    ) -> None:
        """Measure configurations over a workload and load levels; results go to a run directory."""
        from specledger.bench.runner import resume_benchmark, run_benchmark
        from specledger.bench.tables import print_run

        console = Console()
        if drop and resume is None:
            raise BadInput("--drop goes with --resume: it drops an arm from a run being resumed")
        if resume is not None:
            run, path = resume_benchmark(resume, console=Console(stderr=True), show_progress=not no_progress,
                                         drop=drop)
        else:
            slo = {k: v for k, v in (("ttft_s", slo_ttft), ("tpot_s", slo_tpot), ("e2e_s", slo_e2e)) if v is not None}
            if input_tokens is not None:
                workload, per_category = _input_sweep(input_tokens, workload, per_category)
            overrides = {
                "workload.spec": workload, "workload.categories": category or None,
                "workload.per_category": per_category, "workload.limit": limit, "workload.sample": sample,
                "workload.kind": kind, "workload.prompt_column": prompt_column,
                "workload.on_bad_line": on_bad_line, "workload.grader": grader,
                "load.concurrency": [int(c) for c in _floats(concurrency, "concurrency") or []] or None,
                "load.rate": _floats(rate, "rate"), "load.replay": _floats(replay, "replay"),
                "load.num_requests": num_requests, "load.warmup": warmup,
                "slo": slo or None, "output_dir": output_dir, "run_id": run_id, "bootstrap": bootstrap,
                "repeats": repeats, "interleave": interleave, "threads": threads,
                "cpu_watts": cpu_watts, "retry.attempts": retry_attempts, "retry.feedback": retry_feedback,
            }
            if sustain is not None:
                from specledger.bench.steady import sustain_settings

                for k, v in (sustain_settings(sustain) or {}).items():
                    overrides[f"load.steady_state.{k}"] = v
            cfg = build_config(config_file, strategies=strategy, backend=backend, model=model, dtype=dtype,
                               quant=quant, group_size=group_size, params=param, max_tokens=max_tokens,
                               temperature=temperature, seed=seed, base_url=base_url, api=api, tokenizer=tokenizer,
                               retries=retries, timeout=timeout, connect_timeout=connect_timeout, overrides=overrides,
                               api_key_env=api_key_env, server=server,
                               roles=model_roles(draft=(draft_model, draft_dtype, draft_quant),
                                                 intermediate=(intermediate_model, intermediate_dtype,
                                                               intermediate_quant)))
            run, path = run_benchmark(cfg, console=Console(stderr=True), show_progress=not no_progress)
        print_run(run, console)
        if run.noise is not None and run.noise.warning:
            console.print(f"[yellow]warning: noisy machine: {run.noise.warning}.[/yellow]")
        console.print(f"results: {path}")

    @app.command("show")
    def show(run_dir: Path = typer.Argument(..., help="a run directory")) -> None:
        """Reprint a run's tables."""
        from specledger.records.results import load_run
        from specledger.bench.tables import print_run

        print_run(load_run(run_dir))

    @app.command("diff")
    def diff(run_a: Path = typer.Argument(..., help="run directory A"),
             run_b: Path = typer.Argument(..., help="run directory B")) -> None:
        """Compare the aggregates of configurations present in both runs."""
        from specledger.records.results import load_run
        from specledger.bench.tables import diff_table

        Console().print(diff_table(load_run(run_a), load_run(run_b)))
