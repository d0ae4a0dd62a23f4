"""What differs between a model being declared and the one the shards already hold.

A shard refuses a Declare of another model with ESHAPE and a detail naming the first
difference it found (server/ts_store.c, ``same_model``); the client library prefixes it
with the shard (``shard 0 (host:port): ...``). ``describe`` says the same in the terms of
the model being declared ("'x' is (3, 4) on the shards, (4, 4) in this model"), for
tessera.keras's error. A detail it does not know gives None: the caller keeps the
shard's text.
"""
from __future__ import annotations

import re
from typing import Callable, List, Optional, Tuple

_Form = Tuple["re.Pattern[str]", Callable[["re.Match[str]", int], str]]


def _shape(s: str) -> str:
    """"4,8" (the shard's spelling) as Python and Keras print shapes: "(4, 8)"."""
    return repr(tuple(int(d) for d in s.split(",") if d))


def _other_shape(m: "re.Match[str]", n: int) -> str:
    also = ", and another initializer" if m["init"] else ""
    return (f"'{m['name']}' is {_shape(m['have'])} on the shards, {_shape(m['want'])} in "
            f"this model{also}")


def _not_held(m: "re.Match[str]", n: int) -> str:
    return (f"'{m['name']}' of this model is not part of the model the shards hold "
            f"({m['held']} tensors on the shards, {n} in this model)")


def _lacking(m: "re.Match[str]", n: int) -> str:
    # Every tensor of this model matched the shards' at its position, so the ones it lacks
    # are the shards' last held - n, the first of them named.
    more = int(m["held"]) - n - 1
    also = f" and {more} more" if more > 0 else ""
    return (f"the shards' model has tensors this one lacks: '{m['name']}'{also} "
            f"({m['held']} tensors on the shards, {n} in this model)")


def _position(m: "re.Match[str]", n: int) -> str:
    return (f"'{m['name']}' is tensor {m['have']} of the shards' model, {m['want']} of this "
            f"one (counting from 0: layers in another order?)")


def _init(m: "re.Match[str]", n: int) -> str:
    return (f"'{m['name']}' is initialised {m['have']} on the shards, {m['want']} in this "
            f"model")


def _seed(m: "re.Match[str]", n: int) -> str:
    return (f"the shards' model was declared with seed {m['have']}, this one with "
            f"{m['want']} (model.seed)")


_FORMS: List[_Form] = [
    (re.compile(r"tensor '(?P<name>.*)' is already declared with shape \[(?P<have>[\d,]*)\], "
                r"not \[(?P<want>[\d,]*)\](?P<init> \(and another initializer\))?$"),
     _other_shape),
    (re.compile(r"tensor '(?P<name>.*)' is not part of the declared model "
                r"\((?P<held>\d+) tensors\)$"), _not_held),
    (re.compile(r"model already declared with (?P<held>\d+) tensors, not \d+ "
                r"\(tensor '(?P<name>.*)' is missing\)$"), _lacking),
    (re.compile(r"tensor '(?P<name>.*)' is declared at position (?P<have>\d+), "
                r"not (?P<want>\d+)$"), _position),
    (re.compile(r"tensor '(?P<name>.*)' is already declared with initializer (?P<have>\w+), "
                r"not (?P<want>\w+)$"), _init),
    (re.compile(r"model already declared with seed (?P<have>\d+), not (?P<want>\d+)$"),
     _seed),
]
_SHARD = re.compile(r"^shard \d+ \([^)]*\): ")


def describe(detail: str, num_tensors: int) -> Optional[str]:
    """The difference a shard's ESHAPE ``detail`` (with or without the client's ``shard N
    (addr):`` prefix) names, said of the declared model of ``num_tensors`` tensors; None
    for a detail of another form."""
    text = _SHARD.sub("", detail.strip())
    for pattern, say in _FORMS:
        m = pattern.match(text)
        if m:
            return say(m, num_tensors)
    return None
