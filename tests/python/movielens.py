"""MovieLens-100K as shipped inside the RecBole wheel, for the embedding tests.

The data set's licence forbids redistribution, so it is never committed: the wheel is
fetched with ``pip download --no-deps recbole==1.2.1`` into a cache
(``$XDG_CACHE_HOME/tessera/movielens``, default ``~/.cache/tessera/movielens``) the first
time, and the three files are read from the zip. ``load()`` returns None with the reason
when the wheel cannot be had (no network, no pip): the tests skip saying why.

A click is a rating >= 4 (55 % of the 100,000 ratings). Each example has a user, an item,
the user's age bucket, gender and occupation, and the item's genres (up to 6 of 19, as ids
padded with 0). ``fields`` holds the first five as ids of one table, each field's ids
offset past the ones before (as CTR models share a table between fields).
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

WHEEL = "recbole==1.2.1"
_DIR = "recbole/dataset_example/ml-100k/"
GENRES = 6                        # genre ids per item (padded with 0)
FIELDS = ("user", "item", "age", "gender", "occupation")


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tessera" / "movielens"


def _wheel() -> Tuple[Optional[Path], str]:
    cache = _cache()
    found = sorted(cache.glob("recbole-*.whl")) if cache.is_dir() else []
    if found:
        return found[-1], ""
    cache.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--disable-pip-version-check", "-d", str(cache), WHEEL],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"pip download {WHEEL} failed: {e}"
    found = sorted(cache.glob("recbole-*.whl"))
    if r.returncode != 0 or not found:
        return None, f"pip download {WHEEL} failed: {(r.stderr or r.stdout).strip()[-300:]}"
    return found[-1], ""


def _table(z: zipfile.ZipFile, name: str):
    with z.open(_DIR + name) as f:
        lines = io.TextIOWrapper(f, encoding="latin-1").read().splitlines()
    return [line.split("\t") for line in lines[1:] if line]


def _ids(values) -> Dict[str, int]:
    """Each distinct value's id, from 1 (0 is padding)."""
    return {v: i + 1 for i, v in enumerate(sorted(set(values)))}


def load():
    """(data, "") with data a dict of int64 arrays (FIELDS, "genres" (n, GENRES), "label"
    float32 (n, 1)) and the vocabulary sizes in data["vocab"]; or (None, why)."""
    wheel, why = _wheel()
    if wheel is None:
        return None, why
    try:
        with zipfile.ZipFile(wheel) as z:
            inter, users, items = (_table(z, f"ml-100k.{k}") for k in ("inter", "user", "item"))
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        return None, f"{wheel}: no MovieLens-100K inside ({e})"
    occ, gen = _ids(u[3] for u in users), _ids(u[2] for u in users)
    genre = _ids(g for it in items for g in it[3].split())
    user_f = {u[0]: (min(int(u[1]) // 10, 7) + 1, gen[u[2]], occ[u[3]]) for u in users}
    item_g = {}
    for it in items:
        g = [genre[x] for x in it[3].split()][:GENRES]
        item_g[it[0]] = g + [0] * (GENRES - len(g))
    n = len(inter)
    data = {k: np.zeros(n, np.int64) for k in FIELDS}
    data["genres"] = np.zeros((n, GENRES), np.int64)
    data["label"] = np.zeros((n, 1), np.float32)
    for i, (u, it, rating, _ts) in enumerate(inter):
        data["user"][i], data["item"][i] = int(u), int(it)
        data["age"][i], data["gender"][i], data["occupation"][i] = user_f[u]
        data["genres"][i] = item_g[it]
        data["label"][i, 0] = float(rating) >= 4.0
    data["vocab"] = {"user": int(data["user"].max()) + 1, "item": int(data["item"].max()) + 1,
                     "age": 9, "gender": len(gen) + 1, "occupation": len(occ) + 1,
                     "genres": len(genre) + 1}
    off = np.cumsum([0] + [data["vocab"][k] for k in FIELDS])
    data["fields"] = np.stack([data[k] + off[i] for i, k in enumerate(FIELDS)], axis=1)
    data["vocab"]["fields"] = int(off[-1])
    return data, ""


def split(data, test_share: float = 0.2, seed: int = 7):
    """A seeded random split: (train, test), each a dict of arrays."""
    n = data["label"].shape[0]
    perm = np.random.default_rng(seed).permutation(n)
    cut = int(n * (1 - test_share))
    pick = lambda idx: {k: v[idx] for k, v in data.items() if k != "vocab"}  # noqa: E731
    return pick(perm[:cut]), pick(perm[cut:])


def auc(y, p) -> float:
    """ROC AUC by the rank-sum (ties averaged)."""
    y = np.asarray(y).reshape(-1) > 0.5
    p = np.asarray(p, np.float64).reshape(-1)
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(p.size, np.float64)
    sp = p[order]
    i = 0
    while i < p.size:
        j = i
        while j + 1 < p.size and sp[j + 1] == sp[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = int(y.sum())
    neg = y.size - pos
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
