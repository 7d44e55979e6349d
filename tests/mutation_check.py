"""Mutation check: does the fast test suite notice when the code it covers is wrong?

Each mutant is one deliberate bug, made by an exact text replacement in a temporary copy of `src/` and
`tests/`; the relevant fast tests (`pytest -m "not slow" -x`) then run against the copy. A mutant is
*killed* when they fail, and *survives* when they pass: a survivor is a bug the tests cannot see.
The script exits 1 if any mutant survives (or the unmutated copy fails its tests), 2 if a patch
target is no longer in the source (update the mutant: the code moved).

    python tests/mutation_check.py                 # every mutant (a few minutes on 2 cores)
    python tests/mutation_check.py --list
    python tests/mutation_check.py verify-accepts-one-too-many tree-mask-sees-sibling
    python tests/mutation_check.py kv-keep-one-extra --tests tests/decoding/test_decoding.py   # another test selection

A mutant whose code needs a host feature this machine lacks (AMX tiles, oneDNN's bf16 packing) is listed as
*unreachable* rather than run: its tests would pass for want of running the code, not for catching the bug.

Run it from the repository root with the project's Python (the copy is put first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOSSLESS = ["tests/decoding/test_decoding.py::test_greedy_strategies_equal_autoregressive_on_tiny",
            "tests/decoding/test_eagle.py::test_greedy_eagle_equals_autoregressive_on_tiny"]


@dataclass
class Mutant:
    name: str
    why: str  # the bug, in words
    path: str  # relative to the repository root
    old: str  # must occur exactly once
    new: str
    tests: list[str]  # pytest node ids or files, relative to the root
    needs: str = ""  # a host feature without which the mutated code never runs here (HOST_FEATURES)


def _host_isa() -> str:
    from specledger.engine import qkernel

    return qkernel.host_isa()


def _onednn_packs_bf16() -> bool:
    import torch

    from specledger.engine.model import Linear
    from specledger.engine.packed_linear import PackedLinear, pack

    return isinstance(pack(Linear(16, 16, bias=False, dtype=torch.bfloat16)), PackedLinear)


# what a mutant may need, and how to tell whether this host has it; a mutant whose need is missing is reported
# "unreachable" (its code cannot run here, so its tests cannot see it), not counted as killed or survived
HOST_FEATURES = {
    "amx": ("AMX tiles", lambda: _host_isa() == "avx512-vnni+amx"),
    "onednn-bf16": ("oneDNN's bf16 packing (AVX-512 BF16 or AMX)", _onednn_packs_bf16),
}


MUTANTS = [
    Mutant("bf16-cache-values-are-keys", "the fused attention over a bf16 cache weighs the keys instead of the values",
           "src/specledger/engine/csrc/fused.cpp",
           "attend_rows(q, k.const_data_ptr<at::BFloat16>(), v.const_data_ptr<at::BFloat16>()",
           "attend_rows(q, k.const_data_ptr<at::BFloat16>(), k.const_data_ptr<at::BFloat16>()",
           ["tests/engine/test_bf16_cache.py"]),
    Mutant("fused-layer-norms-swapped", "the one-call decoder layer normalises attention's input with the MLP's norm",
           "src/specledger/engine/csrc/fused.cpp", "product(0, rms_norm(r, norm1, eps, act)",
           "product(0, rms_norm(r, norm2, eps, act)", ["tests/engine/test_qkernel.py"]),
    Mutant("fused-layer-no-attention-residual", "the one-call decoder layer drops attention's residual add",
           "src/specledger/engine/csrc/fused.cpp", "  r = product(1, y.view({1, y.size(2)}), r);",
           "  r = product(1, y.view({1, y.size(2)}), std::nullopt);", ["tests/engine/test_qkernel.py"]),
    Mutant("bf16-cache-k-unrotated", "a bf16 cache stores the new token's key before RoPE",
           "src/specledger/engine/csrc/fused.cpp", "    copy_into<float, KT>(obuf, d, kj + start * sstride);",
           "    copy_into<T, KT>(qkv + (h + j) * d, d, kj + start * sstride);",
           ["tests/engine/test_bf16_cache.py"]),
    Mutant("int4-fp-high-nibbles-as-low", "AVX2's many-row 4-bit path reads each chunk's low nibbles twice",
           "src/specledger/engine/csrc/qmm_avx2.cpp", "constexpr int shift = Q < 4 ? 8 * Q : 8 * (Q - 4) + 4;",
           "constexpr int shift = 8 * (Q % 4);", ["tests/engine/test_qkernel.py"]),
    Mutant("int4-fp-padded-rows-shifted", "AVX2's many-row 4-bit path stores a padded group's rows one row off",
           "src/specledger/engine/csrc/qmm_avx2.cpp", "store(a, i, t * 16, 16, pad.data() + (i - r) * 16);",
           "store(a, i, t * 16, 16, pad.data() + (i - r + 1) * 16);", ["tests/engine/test_qkernel.py"]),
    Mutant("bf16-kernel-odd-even-swapped", "the bf16 kernel widens the odd inputs' weights as the even ones'",
           "src/specledger/engine/csrc/bf16mm.cpp",
           "for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_fmadd_ps(wo[j], xo, _mm256_fmadd_ps(we[j], xe, acc[r][j]));",
           "for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_fmadd_ps(we[j], xo, _mm256_fmadd_ps(wo[j], xe, acc[r][j]));",
           ["tests/engine/test_packed_linear.py"]),
    Mutant("bf16-kernel-row-tail-dropped", "the bf16 kernel skips the last weight rows of a chunk not a multiple of its group",
           "src/specledger/engine/csrc/bf16mm.cpp", "  for (; n < n1; ++n) tile<MB, 1>(a, r0, n);\n", "",
           ["tests/engine/test_packed_linear.py"]),
    Mutant("bf16-kernel-eight-rows-as-four", "the bf16 kernel computes a group of eight activation rows as four",
           "src/specledger/engine/csrc/bf16mm.cpp", "r += 8) rows<8, 1>(a, r, s, e);", "r += 8) rows<4, 1>(a, r, s, e);",
           ["tests/engine/test_packed_linear.py"]),
    Mutant("bf16-kernel-three-rows-as-two", "the bf16 kernel computes a group of three activation rows as two",
           "src/specledger/engine/csrc/bf16mm.cpp", "case 3: rows<3, 2>(a, r, s, e); break;",
           "case 3: rows<2, 2>(a, r, s, e); break;", ["tests/engine/test_packed_linear.py"]),
    Mutant("packed-weight-transposed", "a bf16 Linear is packed for oneDNN from its transposed matrix",
           "src/specledger/engine/packed_linear.py", "(w.detach().contiguous(), PACK_ROWS)",
           "(w.detach().t().contiguous(), PACK_ROWS)", ["tests/engine/test_packed_linear.py"], needs="onednn-bf16"),
    Mutant("packed-backward-unguarded", "a packed Linear runs its backward-less op where a gradient is needed",
           "src/specledger/engine/packed_linear.py",
           "if x.dtype != torch.bfloat16 or (torch.is_grad_enabled() and x.requires_grad):", "if x.dtype != torch.bfloat16:",
           ["tests/engine/test_packed_linear.py"], needs="onednn-bf16"),
    Mutant("kernel-linear-backward-unguarded", "a kernel bf16 Linear runs its backward-less op where a gradient is needed",
           "src/specledger/engine/packed_linear.py",
           'or x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad):', 'or x.device.type != "cpu":',
           ["tests/engine/test_packed_linear.py"]),
    Mutant("prompt-chunk-sees-ahead", "a prompt's chunk from an empty cache attends without the causal rule",
           "src/specledger/engine/cpu_ops.py", "is_causal=True, enable_gqa=gqa)", "is_causal=False, enable_gqa=gqa)",
           ["tests/engine/test_engine.py"]),
    Mutant("kv-keep-one-extra", "after verification the cache keeps one rejected tree entry (length off by one)",
           "src/specledger/engine/slot_cache.py", "        self.lengths[slot] = start + n\n",
           "        self.lengths[slot] = start + n + 1\n", ["tests/engine/test_engine.py", *LOSSLESS]),
    Mutant("sync-rollback-one-short", "resynchronising keeps one cached entry past the common prefix",
           "src/specledger/decoding/loop/runner.py",
           "self.cache.rollback(seq.slot, common_prefix(seq.tokens, tokens, min(self.cached(seq), len(tokens) - 1)))",
           "self.cache.rollback(seq.slot, min(self.cached(seq), 1 + common_prefix(seq.tokens, tokens, "
           "min(self.cached(seq), len(tokens) - 1))))", ["tests/engine/test_engine.py", *LOSSLESS]),
    Mutant("tree-mask-sees-sibling", "a tree node attends to its siblings as well as its ancestors",
           "src/specledger/decoding/tree.py", "            m[i, i] = True\n",
           "            m[i, i] = True\n            m[i, [j for j, q in enumerate(self.parents) if q == p]] = True\n",
           ["tests/engine/test_engine.py", *LOSSLESS]),
    Mutant("verify-accepts-one-too-many", "greedy verification accepts the first child after a mismatch",
           "src/specledger/decoding/verify.py", "                return Verdict(path, t)\n",
           "                return Verdict(path + children[cur + 1][:1], t)\n",
           ["tests/decoding/test_decoding.py::test_greedy_tree_verifier_follows_argmax_path", *LOSSLESS]),
    Mutant("sampling-accepts-too-often", "stochastic acceptance uses 1.5 p/q instead of p/q",
           "src/specledger/decoding/verify.py", "u < min(1.0, float(p[x]) / float(q[x]))",
           "u < min(1.0, 1.5 * float(p[x]) / float(q[x]))",
           ["tests/decoding/test_decoding.py::test_tree_verifier_with_several_children_is_exact",
            "tests/decoding/test_decoding.py::test_sampling_follows_target_distribution[draft]"]),
    Mutant("verify-sibling-residual-unnormalised", "the residual p - q is not renormalised before the next sibling",
           "src/specledger/decoding/verify.py", "            p = p / s\n", "            pass\n",
           ["tests/decoding/test_decoding.py::test_sibling_children_see_the_renormalised_residual"]),
    Mutant("scheduler-stop-string-not-cut", "a batched request that meets a stop string stops but keeps the text",
           "src/specledger/decoding/loop/scheduler.py", 'self.out, self.text, self.finish = cut[0], cut[1], "stop"',
           'self.finish = "stop"', ["tests/decoding/test_batching.py::test_stops_in_a_batch_follow_generate"]),
    Mutant("eagle-head-keeps-tree-entry", "the EAGLE head's cache keeps one tree entry after drafting",
           "src/specledger/decoding/drafters/eagle.py", "            self.cache.rollback(g.st.slot, g.committed)\n",
           "            self.cache.rollback(g.st.slot, min(g.committed + 1, self.cache.lengths[g.st.slot]))\n",
           ["tests/decoding/test_eagle.py"]),
    Mutant("eagle-draft-mask-no-ancestors", "EAGLE tree drafting: a node sees only itself, not its ancestors",
           "src/specledger/decoding/drafters/eagle.py", "                        g.anc[s] = g.anc[g.slot_of[p]]\n",
           "                        pass\n", ["tests/decoding/test_eagle.py::test_tree_drafting_equals_each_path_run_alone"]),
    Mutant("eagle-draft-position-off-by-one", "EAGLE tree drafting feeds nodes one position too far",
           "src/specledger/decoding/drafters/eagle.py", "(f,), len(st.tokens) - 2 + d,", "(f,), len(st.tokens) - 1 + d,",
           ["tests/decoding/test_eagle.py::test_tree_drafting_equals_each_path_run_alone"]),
    Mutant("batched-eagle-rows-of-first-sequence", "batched EAGLE drafting gives every sequence the first one's children",
           "src/specledger/decoding/drafters/eagle.py", "st.cand_tokens += ids[row * k : (row + f) * k]",
           "st.cand_tokens += ids[: f * k]", ["tests/decoding/test_batch_drafters.py"]),
    Mutant("batched-draft-model-no-resync", "the batched draft model keeps its own rejected tokens cached",
           "src/specledger/decoding/drafters/model.py", "            runner.sync(st.mseq, s.tokens)\n", "            pass\n",
           ["tests/decoding/test_batch_drafters.py"]),
    Mutant("batched-drafts-one-generator", "batched drafting samples every request with the first one's generator",
           "src/specledger/decoding/drafters/model.py", "verify(fwd.logits, tree, s.sp, s.gen)",
           "verify(fwd.logits, tree, s.sp, seqs[0].gen)",
           ["tests/decoding/test_batch_drafters.py"]),
    Mutant("prefix-cache-keeps-one-stale-entry", "a reused slot keeps one entry past the prefix it shares",
           "src/specledger/decoding/loop/runner.py", "        return slot, lcp[slot]\n",
           "        return slot, lcp[slot] + 1 if lcp[slot] else 0\n", ["tests/decoding/test_batching.py"]),
    Mutant("prefix-cache-template-evicts", "a few shared opening tokens take another prompt's slot",
           "src/specledger/decoding/loop/runner.py", "        if lcp[slot] < SIMILAR * len(tokens):\n",
           "        if False:\n", ["tests/decoding/test_batching.py"]),
    Mutant("batch-worker-off-the-torch-thread", "the batch worker steps on its own thread (a second OpenMP team)",
           "src/specledger/decoding/loop/worker.py", "                threads.run(s.step)\n",
           "                s.step()\n", ["tests/bench/test_threads.py"]),
    Mutant("torch-thread-starter-keeps-its-count", "the thread that starts the torch thread keeps its own count",
           "src/specledger/engine/threads.py", "            torch.set_num_threads(1)  # this thread",
           "            torch.get_num_threads()  # this thread", ["tests/bench/test_threads.py"]),
    Mutant("prefix-cache-keeps-a-failed-slot", "a slot a failed pass may have spoilt stays in the prefix cache",
           "src/specledger/decoding/loop/runner.py", "        if self.prefix_cache and keep:\n",
           "        if self.prefix_cache:\n", ["tests/decoding/test_batching.py"]),
    Mutant("planner-ignores-drafting-time", "the batch planner prices a draft by the verification rows only",
           "src/specledger/decoding/sizing/planner.py",
           "+ (draft_cost(ks) if draft_cost else 0.0)",
           "", ["tests/decoding/test_batch_drafters.py"]),
    Mutant("batched-prior-not-shared", "every new request in a batch starts from the default acceptance prior",
           "src/specledger/decoding/sizing/policy.py", "self.acc[key] = copy.deepcopy(self.population)",
           "self.acc[key] = RankAcceptance() if self.drafter.tree else AcceptanceEMA()",
           ["tests/decoding/test_batch_speculation.py"]),
    Mutant("population-never-relaxes", "the drafter's population estimate stays put while nothing is drafted",
           "src/specledger/decoding/sizing/policy.py", "            self.population.relax(RELAX)\n",
           "            pass\n", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("drafting-sequences-free", "the planner charges nothing for a sequence that drafts",
           "src/specledger/decoding/sizing/planner.py", " + per_drafting * drafting)", ")",
           ["tests/decoding/test_batch_speculation.py"]),
    Mutant("gains-uncalibrated", "the planner takes the acceptance estimates' gains as they are",
           "src/specledger/decoding/sizing/policy.py", "[self.calibration.scaled(self.acc[s.key].gains(n))",
           "[(self.acc[s.key].gains(n))",
           ["tests/decoding/test_batch_speculation.py"]),
    Mutant("prior-outweighs-evidence", "an acceptance EMA moves by its plain weight from the first observation",
           "src/specledger/decoding/sizing/planner.py", "return max(weight, 1.0 / (seen + 2))", "return weight",
           ["tests/decoding/test_batch_speculation.py"]),
    Mutant("drafts-weighed-against-the-chunk", "a draft beside a prompt's chunk is weighed against the whole pass",
           "src/specledger/decoding/sizing/planner.py", "return t0 + cost(base_rows + beside + m) - cost(base_rows + beside) if",
           "return cost(base_rows + beside + m) if", ["tests/decoding/test_batch_speculation.py", "tests/decoding/test_batch_drafters.py"]),
    Mutant("lazy-draft-model-prefills", "the batched draft model prefills every joining prompt when it begins",
           "src/specledger/decoding/drafters/model.py", "        k = runner.cached(m)\n",
           "        if len(seq.tokens) - 1 > runner.cached(m):\n"
           "            runner.forward([RunItem(m, max_run=len(seq.tokens) - 1 - runner.cached(m))])\n"
           "        k = runner.cached(m)\n",
           ["tests/decoding/test_batch_drafters.py"]),
    Mutant("overhead-from-prefill-passes", "passes carrying prefill feed the step-overhead estimate",
           "src/specledger/decoding/loop/scheduler.py", "if self.spec is not None and decoding and not runs:",
           "if self.spec is not None and decoding:", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("fitted-surface-unseen-knots-at-probe", "a knot no pass has reached keeps the probe's (cheaper) price",
           "src/specledger/decoding/sizing/planner.py",
           "ratios = [self.ratio[min(seen, key=lambda s: abs(s - i))] or 1.0 for i in range(len(xs))]",
           "ratios = [self.ratio[i] or 1.0 for i in range(len(xs))]", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("lazy-eagle-head-reads-the-prompt", "the batched EAGLE head feeds every joining prompt when it begins",
           "src/specledger/decoding/drafters/eagle.py", "        self.accept(seq, features)\n",
           "        self.accept(seq, features)\n        self._catch_up([self.seqs[seq.key]])\n",
           ["tests/decoding/test_batch_drafters.py"]),
    Mutant("eagle-catch-up-unpriced", "the EAGLE head's catch-up of a prompt is not in the draft's price",
           "src/specledger/decoding/drafters/eagle.py",
           "+ self.row_s * catch_up", "+ 0.0 * catch_up", ["tests/decoding/test_batch_drafters.py"]),
    Mutant("eagle-draft-priced-as-one-sequence", "an EAGLE draft for many sequences is priced as one sequence's",
           "src/specledger/decoding/drafters/eagle.py", "self.per_seq_s * len(drafting))", "self.per_seq_s)",
           ["tests/decoding/test_batch_drafters.py"]),
    Mutant("every-sequence-drafts-on-the-prior", "before the drafter's acceptance is known every sequence drafts",
           "src/specledger/decoding/sizing/policy.py", "max_drafting=None if self.evidence >= EVIDENCE else 0 if prefill_rows else 1,",
           "max_drafting=None,", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("drafting-at-its-predicted-price", "the planner ignores what drafting passes measured to cost",
           "src/specledger/decoding/sizing/planner.py", "spent = t0 + price * (", "spent = t0 + 1.0 * (",
           ["tests/decoding/test_batch_speculation.py"]),
    Mutant("pass-price-never-learns", "drafting passes never feed the pass calibration",
           "src/specledger/decoding/sizing/policy.py", "self.pass_price.observe(self.last_extra, step_s - plan_s - plain)",
           "self.pass_price.observe(0.0, step_s - plan_s - plain)", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("surface-probed-to-four-rows-a-sequence", "the surface is probed only to 4 rows a sequence of the batch",
           "src/specledger/decoding/sizing/policy.py", "reach = max(4 * max_batch, max_batch + drafter.max_nodes)",
           "reach = 4 * max_batch", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("drafter-prior-ignored", "the population starts from the default prior whatever the drafter measured",
           "src/specledger/decoding/sizing/policy.py", "a0 = drafter.prior if drafter.prior is not None else PRIOR",
           "a0 = PRIOR", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("fixed-k-drafts-one-less", "the fixed draft-length policy drafts K - 1 nodes a step",
           "src/specledger/decoding/sizing/policy.py", "return [min(self.k, c) for c in caps]",
           "return [min(self.k - 1, c) for c in caps]", ["tests/decoding/test_draft_policy.py"]),
    Mutant("scheduler-ignores-draft-length", "the scheduler runs the adaptive planner whatever draft_length says",
           "src/specledger/decoding/loop/scheduler.py", "Speculation(lm, drafter, max_batch, cost, draft_length)",
           "Speculation(lm, drafter, max_batch, cost)", ["tests/decoding/test_draft_policy.py"]),
    Mutant("strategy-drops-draft-length", "a strategy checks draft_length and forgets it",
           "src/specledger/decoding/strategy.py", "self.draft_length = check_draft_length(draft_length)",
           "check_draft_length(draft_length)", ["tests/decoding/test_draft_policy.py"]),
    Mutant("inprocess-ignores-draft-length", "the in-process backend's scheduler always plans adaptively",
           "src/specledger/bench/backends/inprocess.py", "draft_length=self.strategy.draft_length)",
           "draft_length=\"adaptive\")", ["tests/decoding/test_draft_policy.py"]),
    Mutant("server-ignores-draft-length", "the server's scheduler always plans adaptively",
           "src/specledger/server/app.py", "draft_length=strategy.draft_length)", "draft_length=\"adaptive\")",
           ["tests/decoding/test_draft_policy.py"]),
    Mutant("arms-without-their-policy", "compare --arms gives both speculative arms the strategy's default policy",
           "src/specledger/pipeline.py", "params={\"draft_length\": policy}", "params={}",
           ["tests/decoding/test_draft_policy.py"]),
    Mutant("relax-to-the-default-prior", "an acceptance estimate drifts back to the default prior, not its own",
           "src/specledger/decoding/sizing/planner.py", "        self.a += weight * (self.prior - self.a)",
           "        self.a += weight * (PRIOR - self.a)", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("draft-prior-from-the-target-alone", "the draft model's prior compares the target with itself",
           "src/specledger/decoding/drafters/hierarchy.py", "for lm in (target, draft)))", "for lm in (target, target)))",
           ["tests/decoding/test_batch_drafters.py"]),
    Mutant("planner-stops-at-the-first-worse-rate", "the plan's scan stops at the first node that lowers the rate",
           "src/specledger/decoding/sizing/planner.py", "elif (tokens + rest) / spent <= best_rate:",
           "elif tokens / spent <= best_rate:", ["tests/decoding/test_batch_speculation.py"]),
    Mutant("amx-low-digit-from-the-high", "AMX products take the high digit's sums for the low digit's",
           "src/specledger/engine/csrc/qmm_amx.cpp", "if (DIG == 2) _tile_stored(4, c + 256, 64);",
           "if (DIG == 2) _tile_stored(3, c + 256, 64);", ["tests/engine/test_qkernel.py"], needs="amx"),
    Mutant("tree-rows-see-every-new-row", "a tree's rows in the pass's one attention call ignore their masks",
           "src/specledger/engine/csrc/fused.cpp", "ap ? ap + bi * allow.stride(0) : nullptr);", "nullptr);",
           ["tests/decoding/test_batching.py", "tests/engine/test_qkernel.py"]),
    Mutant("chain-rows-on-the-wrong-slot", "rows in the one attention call read the slot of their index",
           "src/specledger/engine/ragged.py", "    rslots = [segments[j].slot for j in short for _ in range(segments[j].n)]",
           "    rslots = [r for j in short for r in range(offsets[j], offsets[j + 1])]", ["tests/decoding/test_batching.py"]),
    Mutant("head-training-sees-the-future", "the EAGLE head's training layer attends past its mask (trained on what "
           "drafting never sees)",
           "src/specledger/train/trainer.py",
           "    y = masked_attention(qk[:, :, : a.n_heads].transpose(1, 2), keys, values, mask)",
           "    y = masked_attention(qk[:, :, : a.n_heads].transpose(1, 2), keys, values, None)",
           ["tests/train/test_train.py::test_unrolled_steps_see_what_tree_nodes_see"]),
    Mutant("cost-attempts-r-not-r-plus-1", "expected attempts with R tries instead of R + 1",
           "src/specledger/ledger/cost_model.py", "    n = retries + 1\n", "    n = retries\n",
           ["tests/ledger/test_ledger_model.py"]),
    Mutant("p-cheapest-argmax", "P(cheapest) counts the dearest configuration",
           "src/specledger/ledger/montecarlo.py", "best = stack == stack.min(axis=0)", "best = stack == stack.max(axis=0)",
           ["tests/ledger/test_ledger_uncertainty.py"]),
    Mutant("percentile-nearest-rank", "latency percentiles by nearest rank instead of interpolation",
           "src/specledger/bench/metrics.py", "np.percentile(x, 100 * q)", "np.percentile(x, 100 * q, method='nearest')",
           ["tests/bench/test_harness_metrics.py"]),
    Mutant("agreement-reference-vs-itself", "the quantization gate's top-1 agreement compares the reference with itself",
           "src/specledger/quality/agreement.py", "top1_agreement(lp_r.argmax(-1), lp_c.argmax(-1))",
           "top1_agreement(lp_r.argmax(-1), lp_r.argmax(-1))",
           ["tests/e2e/test_compare.py::test_quantization_gate_and_verify_curve_are_in_the_run"]),
    Mutant("int4-zero-point-one-step", "the int4 zero point is off by one quantization step",
           "src/specledger/engine/quant.py", "lo + 8 * scale", "lo + 7 * scale", ["tests/engine/test_engine.py"]),
    # the engine's CPU kernels (engine/csrc): each C++ mutant rebuilds the library in the copy (~30 s)
    Mutant("qkernel-int4-min-one-step", "the kernel's int4 min (w = d u + m) is off by one step",
           "src/specledger/engine/quant.py", "mins = grid.zero.float() - 8 * grid.scale.float()",
           "mins = grid.zero.float() - 7 * grid.scale.float()", ["tests/engine/test_qkernel.py"]),
    Mutant("qkernel-int4-nibbles-swapped", "the packed int4 tiles hold the two nibbles the other way round",
           "src/specledger/engine/quant.py", "(c[:, :, :, 0] | (c[:, :, :, 1] << 4))",
           "(c[:, :, :, 1] | (c[:, :, :, 0] << 4))", ["tests/engine/test_qkernel.py"]),
    Mutant("qkernel-avx2-chunk-stride", "the AVX2 int4 tile steps through a block's chunks with the wrong stride",
           "src/specledger/engine/csrc/qmm_avx2.cpp",
           "const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + b * BB + j * 64 + v * 32));",
           "const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt + b * BB + j * 32 + v * 32));",
           ["tests/engine/test_qkernel.py"]),
    Mutant("qkernel-avx2-half-offset", "the AVX2 tile's second half of 8 weight rows starts at the wrong byte",
           "src/specledger/engine/csrc/qmm_avx2.cpp", "const uint8_t* wt = a.w + t * a.nb * BB + h * 32;",
           "const uint8_t* wt = a.w + t * a.nb * BB + h * 16;", ["tests/engine/test_qkernel.py"]),
    Mutant("qkernel-row-remainder", "a remainder of 3 rows computes only 2 of them",
           "src/specledger/engine/csrc/qmm_common.h", "case 3: Tile::template run<3>(a, r, t); break;",
           "case 3: Tile::template run<2>(a, r, t); break;", ["tests/engine/test_qkernel.py"]),
    Mutant("qkernel-low-digit-scale", "the activations' low digit is scaled by 253 instead of 254",
           "src/specledger/engine/csrc/qmm_common.h", "_mm256_set1_ps(254.f)", "_mm256_set1_ps(253.f)",
           ["tests/engine/test_qkernel.py"]),
    Mutant("fused-attention-scale", "the fused one-query attention scales scores by 1/d instead of 1/sqrt(d)",
           "src/specledger/engine/csrc/fused.cpp", "const float scale = 1.f / std::sqrt(static_cast<float>(d));",
           "const float scale = 1.f / static_cast<float>(d);", ["tests/engine/test_qkernel.py"]),
    Mutant("fused-new-token-misses-itself", "the one-call new-token attention leaves out the token's own entry",
           "src/specledger/engine/csrc/fused.cpp", "sstride, start + 1, d, scores, obuf);",
           "sstride, start, d, scores, obuf);", ["tests/engine/test_qkernel.py", "tests/engine/test_bf16_cache.py"]),
    Mutant("qkernel-residual-dropped", "the fused residual add writes the product without the residual",
           "src/specledger/engine/csrc/qmm_common.h", "static_cast<float*>(a.y)[i] = a.res[i] + v[c];",
           "static_cast<float*>(a.y)[i] = v[c];", ["tests/engine/test_qkernel.py"]),
    Mutant("fused-rope-second-half", "the fused RoPE uses the first half's (negated) sin for the second half",
           "src/specledger/engine/csrc/fused.cpp", "_mm256_fmadd_ps(lo, load8<T>(sr + half + j)",
           "_mm256_fmadd_ps(lo, load8<T>(sr + j)", ["tests/engine/test_qkernel.py"]),
    Mutant("config-forgets-max-new-tokens", "a config file or run.json written before the rename to max_tokens no "
           "longer loads (max_new_tokens: the old spelling)",
           "src/specledger/records/config.py",
           'Field(128, ge=1, validation_alias=AliasChoices("max_tokens", "max_new_tokens"))', "Field(128, ge=1)",
           ["tests/bench/test_harness_config.py::test_old_spelling_max_new_tokens_still_reads_and_means_the_same"]),
    # what a user reads of the ledger and the bench (issue 56: each of these passed every test before)
    Mutant("threshold-search-stops-at-10x", "the decision-threshold search looks only 10x past today's value, not 100x",
           "src/specledger/ledger/thresholds.py", "up = [current * 10.0 ** k for k in range(1, 3)]",
           "up = [current * 10.0 ** k for k in range(1, 2)]", ["tests/ledger/test_threshold_search.py"]),
    Mutant("threshold-farther-crossing", "of crossings on both sides of today's value, the farther one is reported",
           "src/specledger/ledger/thresholds.py", "    _, value, side, after = min(found)\n",
           "    _, value, side, after = max(found)\n", ["tests/ledger/test_threshold_search.py"]),
    Mutant("threshold-never-crossing-wrong-side", "samples that never cross within the search are put on its near side",
           "src/specledger/ledger/thresholds.py", "far = -np.inf if values and values[-1] < now else np.inf",
           "far = np.inf if values and values[-1] < now else -np.inf", ["tests/ledger/test_threshold_search.py"]),
    Mutant("nvml-energy-as-microjoules", "NVML's energy counter (millijoules) read as microjoules: 1000x too small",
           "src/specledger/bench/energy.py", "- start) / 1e3  # mJ", "- start) / 1e6  # mJ",
           ["tests/bench/test_energy.py::test_nvml_counter_is_read_in_millijoules"]),
    Mutant("steady-joules-over-the-window-twice", "steady-state joules per request divided by the window again",
           "src/specledger/bench/steady.py", "/ (n * self.window)\n", "/ (n * self.window) / self.window\n",
           ["tests/bench/test_sustain.py::test_steady_joules_per_request_are_the_steady_windows_joules_over_their_requests"]),
    Mutant("pool-key-without-activations", "a model's pool key leaves out its activation precision (W4A8 gets W4A16)",
           "src/specledger/engine/pool.py", 'group_size if quant == "int4" else None, device, activations)',
           'group_size if quant == "int4" else None, device)', ["tests/engine/test_model_pool.py"]),
    Mutant("draft-model-extra-round", "a draft model runs one more round per chain than its length (k+1 passes)",
           "src/specledger/decoding/drafters/model.py", "if len(chains[i]) < min(self.min_chain, budgets[i])",
           "if len(chains[i]) <= min(self.min_chain, budgets[i])",
           ["tests/decoding/test_batch_drafters.py::test_a_draft_model_makes_a_chain_of_k_in_k_passes"]),
    Mutant("failed-requests-not-in-sampled-pass-rate", "the Monte Carlo's pass-rate draws ignore failed requests",
           "src/specledger/ledger/montecarlo.py", "    failed = m.requests_failed if m.graded else 0\n",
           "    failed = 0\n", ["tests/ledger/test_ledger_uncertainty.py"]),
    Mutant("pass-rate-plus-minus-shorter-side", "the terminal's pass-rate ± shows the shorter side of its interval",
           "src/specledger/report/terminal.py", "half = f\"±{100 * max(r.pass_rate - r.pass_low,",
           "half = f\"±{100 * min(r.pass_rate - r.pass_low,", ["tests/report/test_terminal_pass_rate.py"]),
    Mutant("final-writes-in-place", "run.json and summary.csv written in place: a kill leaves them empty or torn",
           "src/specledger/records/durable.py", "    tmp = path.with_name(path.name + \".tmp\")\n", "    tmp = path\n",
           ["tests/bench/test_durable_writes.py"]),
    Mutant("final-writes-unsynced", "a final file is renamed into place before its data reached the disk",
           "src/specledger/records/durable.py", "            os.fsync(f.fileno())\n", "",
           ["tests/bench/test_durable_writes.py"]),
    Mutant("final-rename-unsynced", "the directory is not fsynced after the rename (the rename may not survive)",
           "src/specledger/records/durable.py", "    sync_directory(path.parent)\n", "",
           ["tests/bench/test_durable_writes.py"]),
    Mutant("noise-probe-timed-cold", "the calibration probe is timed without its untimed warm-up",
           "src/specledger/bench/calibration.py", "while time.perf_counter() - start < warm_s:", "while False:",
           ["tests/bench/test_calibration.py"]),
    Mutant("noise-probe-one-round", "the calibration probe trusts its first timed round",
           "src/specledger/bench/calibration.py", "    for _ in range(WARM_ROUNDS):", "    for _ in range(1):",
           ["tests/bench/test_calibration.py"]),
    Mutant("server-arm-labelled-as-the-engine", "a llama-server arm is labelled with the in-process default (fp32)",
           "src/specledger/records/config.py", "               config_precision(bc), sampling_label(bc.sampling))",
           "               precision_label(bc.dtype, bc.quant, bc.group_size, bc.activations), sampling_label(bc.sampling))",
           ["tests/bench/test_server_precision.py::test_a_llama_server_arm_is_labelled_with_its_files_quantization"]),
    Mutant("gguf-header-array-skipped-short", "the GGUF header reader skips one element of a numeric array, not all",
           "src/specledger/engine/registry.py", "f.seek(_SCALAR_BYTES[item] * count, 1)", "f.seek(_SCALAR_BYTES[item], 1)",
           ["tests/bench/test_server_precision.py::test_the_quantization_is_read_from_the_header_past_the_values_before_it"]),
    # issue 55: one of each idea
    Mutant("speedup-of-an-unmeasured-rate", "a configuration that measured no tok/s gets a speed-up of 0, not none",
           "src/specledger/records/pairing.py", "return tok_s / base_tok_s if tok_s and base_tok_s else None",
           "return tok_s / base_tok_s if base_tok_s else None",
           ["tests/bench/test_pairing.py::test_a_speedup_needs_both_rates_measured"]),
    Mutant("cap-old-name-forgotten", "lookup's num_tokens is no longer read as its max_nodes",
           "src/specledger/decoding/params.py", '    max_nodes: int | None = _cap(None, "num_tokens")  # None: 8',
           "    max_nodes: int | None = _cap(None)  # None: 8",
           ["tests/decoding/test_strategy_params.py::test_the_draft_size_cap_has_one_name_and_its_old_ones_still_read"]),
    Mutant("params-written-under-new-names", "a configuration given an old spelling is written back under the new",
           "src/specledger/decoding/params.py",
           "        return {self._spelled.get(n, n): v for n, v in self.arguments().items()}",
           "        return self.arguments()",
           ["tests/decoding/test_strategy_params.py::test_the_draft_size_cap_has_one_name_and_its_old_ones_still_read"]),
]


def copy_tree(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for part in ("src", "tests"):
        shutil.copytree(ROOT / part, dst / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


def occurrences(m: Mutant, tree: Path = ROOT) -> int:
    """How often the code the mutant replaces occurs in its file (it must be exactly once)."""
    return (tree / m.path).read_text().count(m.old)


def apply(m: Mutant, tree: Path) -> None:
    f = tree / m.path
    text = f.read_text()
    count = text.count(m.old)
    if count != 1:
        raise LookupError(f"mutant {m.name}: {m.old!r} occurs {count} times in {m.path} (want exactly once)")
    f.write_text(text.replace(m.old, m.new))


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[bool, str]:
    """True when the tests pass. The copy's src comes first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-m", "not slow", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    lines = (p.stdout + p.stderr).strip().splitlines()
    return p.returncode == 0, lines[-1] if lines else f"exit {p.returncode}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip running the selected tests unmutated first")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    ap.add_argument("--tests", nargs="+", metavar="TEST",
                    help="run these tests against every chosen mutant instead of each mutant's own selection")
    args = ap.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:32} {m.why}")
        return 0
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"error: unknown mutant(s) {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    chosen = [known[n] for n in args.names] or MUTANTS
    if args.tests:
        chosen = [replace(m, tests=args.tests) for m in chosen]
    for m in chosen:  # every patch target must still be there before anything runs
        if (count := occurrences(m)) != 1:
            print(f"error: mutant {m.name}: {m.old!r} occurs {count} times in {m.path} "
                  "(want exactly once; update the mutant)", file=sys.stderr)
            return 2
    missing = {k: what for k, (what, has) in HOST_FEATURES.items() if any(m.needs == k for m in chosen) and not has()}
    unreachable = [m for m in chosen if m.needs in missing]
    for m in unreachable:
        print(f"{m.name:32} {'unreachable':8} on this host: its code needs {missing[m.needs]}", flush=True)
    chosen = [m for m in chosen if m not in unreachable]
    survivors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="specledger-mutants-") as tmp:
        if not args.no_baseline:
            base = Path(tmp) / "baseline"
            copy_tree(base)
            tests = sorted({t for m in chosen for t in m.tests})
            t0 = time.perf_counter()
            ok, last = run_tests(base, tests, args.timeout)
            print(f"{'baseline':32} {'passes' if ok else 'FAILS'} ({time.perf_counter() - t0:.0f} s): {last}", flush=True)
            if not ok:
                print("error: the unmutated tests fail; a mutation check means nothing", file=sys.stderr)
                return 1
        for m in chosen:
            tree = Path(tmp) / m.name
            copy_tree(tree)
            apply(m, tree)
            t0 = time.perf_counter()
            passed, last = run_tests(tree, m.tests, args.timeout)
            verdict = "SURVIVED" if passed else "killed"
            print(f"{m.name:32} {verdict:8} ({time.perf_counter() - t0:.0f} s): {last}", flush=True)
            if passed:
                survivors.append(m.name)
            shutil.rmtree(tree)
    print(f"{len(chosen) - len(survivors)}/{len(chosen)} mutants killed"
          + (f"; survived: {', '.join(survivors)}" if survivors else "")
          + (f"; unreachable on this host: {', '.join(m.name for m in unreachable)}" if unreachable else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
