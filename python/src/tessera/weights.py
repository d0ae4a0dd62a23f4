"""A model's parameters as ``psctl export`` writes them, read back with numpy alone.

``psctl export --format safetensors|npz -o FILE`` writes every dense tensor of a job by its
declared name (``conv1/kernel``, float32) and the job's description as metadata;
:func:`load_weights` puts them into the Keras model that has the same variables (the names
``tessera.keras`` declares: ``variable.path``), and :func:`read_weights` hands them to numpy
or another framework. No dependency beyond numpy: a safetensors file is an 8-byte
little-endian header length, a JSON header and the raw bytes, parsed here.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile
from collections import Counter
from typing import Any, Dict, List, Tuple

import numpy as np

# safetensors' dtypes that psctl export writes (and a few more a reader meets).
_ST_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "U64": "<u8",
              "I32": "<i4", "U32": "<u4", "U8": "u1", "I8": "i1"}
# The largest safetensors header read (the format's own readers stop at 100 MB).
_MAX_HEADER = 100 << 20


def _read_safetensors(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header "
                             f"length)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: not a safetensors file (header length {n} of a "
                             f"{size}-byte file)")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{path}: the safetensors header is not JSON: {e}") from None
        data = f.read()
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    arrays: Dict[str, np.ndarray] = {}
    for name, t in header.items():
        try:
            dtype = np.dtype(_ST_DTYPES[t["dtype"]])
            shape = tuple(int(d) for d in t["shape"])
            lo, hi = (int(o) for o in t["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name!r}: a bad header entry {t!r}") from None
        want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not 0 <= lo <= hi <= len(data) or hi - lo != want:
            raise ValueError(f"{path}: tensor {name!r}: bytes [{lo}, {hi}) do not hold "
                             f"{t['dtype']} {list(shape)} in {len(data)} bytes of data")
        arrays[name] = np.frombuffer(data, dtype, count=want // dtype.itemsize,
                                     offset=lo).reshape(shape)
    return arrays, {str(k): str(v) for k, v in meta.items()}


def _read_npz(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable .npz: {e}") from None
    raw = arrays.pop("__metadata__", None)
    meta: Dict[str, str] = {}
    if raw is not None:
        try:
            meta = {str(k): str(v) for k, v in json.loads(raw.tobytes().decode()).items()}
        except (ValueError, AttributeError):
            raise ValueError(f"{path}: its __metadata__ is not a UTF-8 JSON object") from None
    return arrays, meta


def read_weights(path: "str | os.PathLike[str]") -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """Read a file of ``psctl export`` (safetensors or .npz, told apart by their first bytes).

    Parameters
    ----------
    path : str or os.PathLike
        The file.

    Returns
    -------
    (dict of str to numpy.ndarray, dict of str to str)
        The arrays by name (read-only views for safetensors) and the metadata: ``format``
        ("tessera"), ``tessera.version``, ``tessera.step`` (the step the parameters are at),
        ``tessera.job`` (the job's settings, a JSON object of key to value text, as the job
        file spells them) and ``tessera.state_tensors`` (a JSON list of the names that are
        state, not trainable: BatchNormalization's moving statistics).

    Raises
    ------
    OSError
        The file cannot be read.
    ValueError
        It is neither format, or is damaged (which entry, and how).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"PK\x03\x04":
        return _read_npz(path)
    return _read_safetensors(path)


def load_weights(path: "str | os.PathLike[str]", model: Any, *, strict: bool = True) -> List[str]:
    """Load a file of ``psctl export`` into a Keras model, variable by variable.

    A variable is matched by its Keras path (``variable.path``, e.g.
    ``sequential/conv1/kernel``), the name ``tessera.keras`` declares it under, or by that
    path without the model's own name in front (``conv1/kernel``), which is ps-worker's name
    for the same layer: a Keras model with layers named as the job file's (``conv1``,
    ``fc1``, ...) takes a ps-worker job's file. A table exported without ``--vocab``
    (``NAME/ids`` and ``NAME/rows``) goes into a variable named ``NAME`` of shape
    ``[vocabulary, dim]``: each listed id's row is set, the other rows keep their values
    (an id outside the vocabulary is an error). Nothing can put such rows into the shards
    or into an unbounded ``tessera.keras.Embedding`` (its rows live on the shards): with
    ``strict`` they are refused as arrays of no variable; ``strict=False`` skips them, and
    :func:`read_weights` returns them. Nothing is assigned unless every check passes.

    Parameters
    ----------
    path : str or os.PathLike
        The file (safetensors or .npz).
    model : keras.Model
        A built model (its variables exist: call it once, or give it an ``Input``).
    strict : bool, default True
        Every variable of the model must be in the file and every array of the file must be
        a variable of the model. With False, arrays with no variable are ignored and
        variables with no array keep their values (a model that shares only some layers).

    Returns
    -------
    list of str
        The file's names loaded, in the model's order.

    Raises
    ------
    ValueError
        Names missing from the file or the model (with strict), two variables of one path, or
        a shape that differs (each named with both shapes); the model is then unchanged.
    """
    arrays, _ = read_weights(path)
    variables = list(model.weights)
    if not variables:
        raise ValueError("load_weights: the model has no variables yet: build it first "
                         "(call it on a batch, or start it with keras.Input)")
    names = [v.path for v in variables]
    dup = sorted(n for n, count in Counter(names).items() if count > 1)
    if dup:
        raise ValueError(f"load_weights: several variables are named {dup}: give the layers "
                         f"distinct names")
    prefix = f"{model.name}/"
    # A table exported without --vocab: NAME/ids (int64) and NAME/rows, its rows by id.
    pairs = {n[:-4] for n in arrays if n.endswith("/ids") and n[:-4] + "/rows" in arrays}
    have = set(arrays) | pairs
    keys = [n if n in have or not n.startswith(prefix) or n[len(prefix):] not in have
            else n[len(prefix):] for n in names]
    missing = [n for n, k in zip(names, keys) if k not in have]
    used = set(keys) | {k + s for k in keys if k in pairs and k not in arrays
                        for s in ("/ids", "/rows")}
    extra = sorted(set(arrays) - used)
    problems = []
    if strict and missing:
        problems.append(f"the model's variables {missing} are not in {os.fspath(path)}")
    if strict and extra:
        hint = ("; a table's NAME/ids and NAME/rows load only into a variable named NAME "
                "(a bounded [vocabulary, dim] matrix): pass strict=False to skip them"
                if any(n.endswith(("/ids", "/rows")) for n in extra) else "")
        problems.append(f"{os.fspath(path)} holds {extra}, which are no variable of the model "
                        f"(its variables: {names}){hint}")
    for k, v in zip(keys, variables):
        if k in arrays and tuple(arrays[k].shape) != tuple(v.shape):
            problems.append(f"{k}: the file's shape is {list(arrays[k].shape)}, the model's "
                            f"{list(v.shape)}")
        elif k not in arrays and k in pairs:
            ids, rows = arrays[k + "/ids"], arrays[k + "/rows"]
            shape = tuple(v.shape)
            if (len(shape) != 2 or ids.ndim != 1 or rows.shape != (ids.shape[0], shape[1])):
                problems.append(f"{k}: the file's ids {list(ids.shape)} and rows "
                                f"{list(rows.shape)} do not fit the model's {list(shape)}")
            elif ids.size and (int(ids.min()) < 0 or int(ids.max()) >= shape[0]):
                bad = int(np.count_nonzero((ids < 0) | (ids >= shape[0])))
                problems.append(f"{k}: {bad} of the file's ids are outside the model's "
                                f"vocabulary 0..{shape[0] - 1}")
    if problems:
        raise ValueError("load_weights: " + "; ".join(problems))
    loaded = []
    for k, v in zip(keys, variables):
        if k in arrays:
            v.assign(np.asarray(arrays[k], dtype=v.dtype))
            loaded.append(k)
        elif k in pairs:
            value = np.array(v.numpy())
            value[arrays[k + "/ids"]] = arrays[k + "/rows"]
            v.assign(value)
            loaded.append(k)
    return loaded
