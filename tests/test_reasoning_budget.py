"""The reasoning budget (engine/sampling/reasoning_budget.py) against plain greedy runs
of the demo model: a block that opens (in the prompt or by a start tag) gets N tokens,
then the forced tokens, then the model goes on as if they were its own; an end tag
written in time closes it and forces nothing; a sequence beside it is untouched."""

from __future__ import annotations

import pytest

from engine import DEMO_MODEL, Engine, SamplingParams
from engine.sampling.reasoning_budget import BudgetSpec, ReasoningBudget, utf8_complete

PROMPT = "def fibonacci(n):"
N = 24
FORCED = (300, 301)


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(str(DEMO_MODEL), n_seq_max=2, n_ctx=512)


def greedy(engine, prompt: list[int], budgets: list[BudgetSpec | None]) -> list[list[int]]:
    seqs = [
        engine.add_sequence(
            prompt, SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, reasoning_budget=b), i
        )
        for i, b in enumerate(budgets)
    ]
    while engine.has_work:
        engine.step()
    return [s.output_ids for s in seqs]


def test_utf8_completeness():
    assert utf8_complete(b"abc") and utf8_complete("é".encode()) and utf8_complete("€x".encode())
    assert not utf8_complete("é".encode()[:1]) and not utf8_complete("€".encode()[:2])
    assert utf8_complete("😀".encode()) and not utf8_complete("😀".encode()[:3]) and utf8_complete(b"")


def test_the_state_machine_counts_forces_and_re_arms():
    b = ReasoningBudget(BudgetSpec(2, (7,), ((8, 9),), (5, 6)))
    assert b.forced() is None
    for tok in (1, 7, 1):  # the start tag opens the block; one token of two spent
        b.accept(tok, True)
    assert b.forced() is None
    b.accept(2, False)  # spent, but in the middle of a character
    assert b.forced() is None
    b.accept(3, True)
    assert b.forced() == 5
    b.accept(5, True)
    assert b.forced() == 6
    b.accept(6, True)
    assert b.forced() is None and b.state == b.DONE
    for tok in (7, 8, 9, 1, 1, 1):  # open again, closed by the model in time: nothing forced
        b.accept(tok, True)
        assert b.forced() is None


def test_a_spent_budget_forces_the_end_and_the_model_goes_on(engine):
    prompt = engine.tokenizer.encode(PROMPT, True)
    (plain,) = greedy(engine, prompt, [None])
    spec = BudgetSpec(5, (999,), ((998,),), FORCED, opened=True)
    budgeted, beside = greedy(engine, prompt, [spec, None])
    assert budgeted[:5] == plain[:5] and budgeted[5:7] == list(FORCED)
    (after,) = greedy(engine, prompt + plain[:5] + list(FORCED), [None])
    assert budgeted[7:] == after[: N - 7]  # the forced tokens are context like any other
    assert beside == plain  # the other row of the batch is untouched


def test_a_start_tag_opens_the_block_and_an_end_tag_closes_it(engine):
    prompt = engine.tokenizer.encode(PROMPT, True)
    (plain,) = greedy(engine, prompt, [None])
    opened_at = (plain[1],)
    (budgeted,) = greedy(engine, prompt, [BudgetSpec(2, opened_at, ((998,),), FORCED)])
    first = plain.index(plain[1]) + 1  # counting starts after the start tag's first appearance
    assert budgeted[: first + 2] == plain[: first + 2] and budgeted[first + 2 : first + 4] == list(FORCED)
    closed = BudgetSpec(10, (999,), ((plain[3],),), FORCED, opened=True)  # the model writes the end tag in time
    assert greedy(engine, prompt, [closed]) == [plain]
    at_once = BudgetSpec(0, (999,), ((998,),), FORCED, opened=True)
    assert greedy(engine, prompt, [at_once])[0][:2] == list(FORCED)
