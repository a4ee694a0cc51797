"""What tokens cost: a price table by model name, and the cost of usage by model.

convoq ships no prices (they change, and differ by contract, region and batch); a
deployment gives its own in ``CONVOQ_MODEL_PRICES`` as JSON, US dollars per million tokens::

    {"gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25},
     "claude-*": {"input": 3, "output": 15}}

A name ending in ``*`` prices every model whose name starts with what precedes it (the
longest such prefix wins; an exact name wins over any prefix). Cached prompt tokens cost
``cached_input`` (default: ``input``); reasoning tokens are part of the completion, as the
OpenAI API counts them, and cost ``output``. A model with no price is named in
:attr:`Cost.unpriced` and adds nothing to the total: a cost is never guessed.

Which model answered is on each assistant message (:attr:`convoq.messages.Message.model`)
and summed per model in a conversation's counters, so a conversation's cost is one read
whatever its length, on every path that stores turns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError

from convoq.errors import ConfigurationError
from convoq.usage import Usage

PER = 1_000_000
"""Prices are per this many tokens."""


class ModelPrice(BaseModel):
    """US dollars per million tokens of one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input: NonNegativeFloat
    output: NonNegativeFloat
    cached_input: NonNegativeFloat | None = Field(
        default=None, description="Prompt tokens served from the provider's cache (default: input)."
    )

    def cost(self, usage: Usage) -> float:
        """What ``usage`` costs at this price, in US dollars."""
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        fresh = usage.prompt_tokens - cached
        spent = fresh * self.input + cached * cached_price + usage.completion_tokens * self.output
        return spent / PER


class Cost(BaseModel):
    """The cost of some usage by model: what could be priced, and which models could not."""

    usd: float = Field(description="US dollars, the priced models' sum.")
    by_model: dict[str, float] = Field(default_factory=dict, description="Priced models only.")
    unpriced: list[str] = Field(
        default_factory=list, description="Models used that the price table does not price."
    )


class PriceTable:
    """Model name (or ``prefix*``) -> :class:`ModelPrice`."""

    def __init__(self, prices: Mapping[str, ModelPrice] | None = None) -> None:
        prices = dict(prices or {})
        self._exact = {name: p for name, p in prices.items() if not name.endswith("*")}
        by_prefix = {name[:-1]: p for name, p in prices.items() if name.endswith("*")}
        self._prefixes = sorted(by_prefix.items(), key=lambda item: -len(item[0]))

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> PriceTable:
        """The table from its JSON form (``CONVOQ_MODEL_PRICES``).

        Raises:
            ConfigurationError: a price that is not ``{"input": n, "output": n}`` with
                non-negative numbers (and optionally ``cached_input``).
        """
        prices: dict[str, ModelPrice] = {}
        for name, value in (raw or {}).items():
            if not name:
                raise ConfigurationError(
                    "CONVOQ_MODEL_PRICES: a model name is empty; name the model (or a prefix*)",
                    option="model_prices",
                )
            try:
                prices[name] = ModelPrice.model_validate(value)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "the price"
                raise ConfigurationError(
                    f"CONVOQ_MODEL_PRICES[{name!r}]: {where}: {first['msg']}; give US dollars"
                    ' per million tokens, e.g. {"input": 2.5, "output": 10, "cached_input": 1.25}',
                    option="model_prices",
                ) from None
        return cls(prices)

    def __bool__(self) -> bool:
        return bool(self._exact or self._prefixes)

    def price_of(self, model: str) -> ModelPrice | None:
        """The model's price: its exact name, else the longest ``prefix*`` it starts with."""
        found = self._exact.get(model)
        if found is not None:
            return found
        for prefix, price in self._prefixes:
            if model.startswith(prefix):
                return price
        return None

    def cost(self, by_model: Mapping[str, Usage]) -> Cost:
        """What usage by model costs (models with no price are named, not counted)."""
        priced: dict[str, float] = {}
        unpriced: list[str] = []
        for model, usage in by_model.items():
            price = self.price_of(model)
            if price is None:
                unpriced.append(model)
            else:
                priced[model] = price.cost(usage)
        return Cost(usd=sum(priced.values()), by_model=priced, unpriced=sorted(unpriced))
