"""A request prefilling alone takes bigger chunks (Scheduler's solo_prefill_chunk, issue 54 item 3); beside another
request, decoding or waiting, the chunk limit holds as before; either way the tokens are greedy decoding's."""

from __future__ import annotations

import pytest
import torch

from specledger.decoding.loop.scheduler import Scheduler
from specledger.decoding.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.support.varied_model import plain_greedy

pytestmark = pytest.mark.usefixtures("one_thread")
CHUNK, SOLO = 16, 128


@pytest.fixture(scope="module")
def lm():
    return tiny_model(seed=4)


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def steps_to_first_token(s: Scheduler, ids: list[int], n: int) -> tuple[int, list[int]]:
    s.add(ids, SamplingParams(max_tokens=n))
    passes, rows, out = 0, [], None
    while s.has_work():
        for r in s.step():
            out = r.token_ids
        passes += 1
        rows.append(s.last_rows)
    assert out is not None
    return rows.index(1) if 1 in rows else passes, out


def test_alone_a_long_prompt_takes_solo_chunks_and_decodes_as_greedy(lm):
    ids = prompt(200)
    ref = plain_greedy(lm, ids, 6)
    chunked, out = steps_to_first_token(Scheduler(lm, max_batch=2, prefill_chunk=CHUNK), ids, 6)
    solo, out_solo = steps_to_first_token(Scheduler(lm, max_batch=2, prefill_chunk=CHUNK, solo_prefill_chunk=SOLO),
                                          ids, 6)
    assert (chunked, solo) == (-(-200 // CHUNK), -(-200 // SOLO))
    assert out == out_solo == ref


def test_beside_a_decoding_request_the_chunk_limit_holds(lm):
    s = Scheduler(lm, max_batch=2, prefill_chunk=CHUNK, solo_prefill_chunk=SOLO)
    first = s.add(prompt(5, 1), SamplingParams(max_tokens=60))
    s.step()
    s.step()  # the first request decodes
    second = s.add(prompt(200, 2), SamplingParams(max_tokens=4))
    got, rows = {}, []
    while s.has_work():
        got |= {r.request_id: r.token_ids for r in s.step()}
        if first not in got:
            rows.append(s.last_rows)
    assert max(rows) == CHUNK + 1  # its chunk and the decoding row, never a solo chunk
    assert got[second] == plain_greedy(lm, prompt(200, 2), 4)
    assert got[first] == plain_greedy(lm, prompt(5, 1), 60)


def test_with_a_request_waiting_the_chunk_limit_holds(lm):
    s = Scheduler(lm, max_batch=1, prefill_chunk=CHUNK, solo_prefill_chunk=SOLO)
    s.add(prompt(200, 3), SamplingParams(max_tokens=2))
    s.add(prompt(30, 4), SamplingParams(max_tokens=2))  # waits for the only slot
    s.step()
    assert s.last_rows == CHUNK
    assert s.params()["solo_prefill_chunk"] == SOLO
