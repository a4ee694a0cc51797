"""The price table: exact names before prefixes, cached prompt tokens at their own price,
unpriced models named and never guessed, and a bad table refused at start-up."""

from __future__ import annotations

import pytest

from convoq.errors import ConfigurationError
from convoq.pricing import ModelPrice, PriceTable
from convoq.usage import Usage

USAGE = Usage(requests=2, prompt_tokens=1_000_000, completion_tokens=500_000,
              total_tokens=1_500_000, cached_tokens=400_000, reasoning_tokens=100_000)  # fmt: skip


def test_cached_prompt_tokens_cost_their_own_price_and_reasoning_counts_as_output() -> None:
    price = ModelPrice(input=2.0, output=8.0, cached_input=0.5)
    # 600k fresh prompt at 2, 400k cached at 0.5, 500k completion (reasoning in it) at 8.
    assert price.cost(USAGE) == pytest.approx(1.2 + 0.2 + 4.0)
    # Without a cached price, cached tokens cost the input price.
    assert ModelPrice(input=2.0, output=8.0).cost(USAGE) == pytest.approx(2.0 + 4.0)


def test_an_exact_name_wins_over_a_prefix_and_the_longest_prefix_wins() -> None:
    table = PriceTable.parse({
        "gpt-4o": {"input": 1, "output": 1},
        "gpt-*": {"input": 2, "output": 2},
        "gpt-4o-*": {"input": 3, "output": 3},
    })  # fmt: skip
    prices = {name: table.price_of(name) for name in ("gpt-4o", "gpt-4o-mini", "gpt-5", "claude")}
    assert {name: p.input if p else None for name, p in prices.items()} == {
        "gpt-4o": 1, "gpt-4o-mini": 3, "gpt-5": 2, "claude": None,
    }  # fmt: skip


def test_a_model_without_a_price_is_named_and_adds_nothing() -> None:
    table = PriceTable.parse({"a": {"input": 1, "output": 1}})
    cost = table.cost({"a": Usage(prompt_tokens=1_000_000), "b": Usage(prompt_tokens=5)})
    assert (cost.usd, cost.by_model, cost.unpriced) == (1.0, {"a": 1.0}, ["b"])
    assert not PriceTable.parse(None) and table


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"m": {"input": -1, "output": 1}}, "CONVOQ_MODEL_PRICES['m']: input"),
        ({"m": {"input": 1}}, "CONVOQ_MODEL_PRICES['m']: output: Field required"),
        ({"m": {"input": 1, "output": 1, "cache": 1}}, "cache: Extra inputs"),
        ({"m": "cheap"}, "CONVOQ_MODEL_PRICES['m']"),
        ({"": {"input": 1, "output": 1}}, "a model name is empty"),
    ],
)
def test_a_bad_price_is_refused_saying_where_and_what_to_give(
    raw: dict[str, object], said: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PriceTable.parse(raw)
    assert said in str(caught.value)
