"""Tessera: a parameter-server cluster for data-parallel training; this is its Python client.

Pull parameters into, and push gradients from, numpy float32 arrays without copies; the
requests run on the C client library's own thread with the GIL released. See
docs/python.md in the repository.

    import numpy as np, tessera
    with tessera.Client("job.cfg", task=0) as c:
        params = c.declare({"w": (784, 10), "b": (10,)})
        c.pull(params)                      # params["w"] now holds the shards' values
        c.push({"w": gw, "b": gb})          # gradients, float32, C-contiguous
"""
from __future__ import annotations

from . import _client
from ._errors import (
    AuthError,
    Busy,
    ConfigError,
    DeadlineExceeded,
    Interrupted,
    InvalidArgument,
    NonFiniteGradient,
    NotDeclared,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ShapeError,
    StaleGradient,
    TesseraError,
    Unavailable,
    UnknownTable,
    UnknownTensor,
    error_class,
)
from ._job import Job, load_job
from .client import Client, PushResult, Request, ShardStatus, Tensor, WorkerStatus
from .tables import RowsPushResult, Table
from .weights import load_weights, read_weights

#: The version of the C library compiled into the extension ("MAJOR.MINOR.PATCH").
__version__: str = _client.version

__all__ = [
    "AuthError", "Busy", "Client", "ConfigError", "DeadlineExceeded", "Interrupted",
    "InvalidArgument", "Job", "NonFiniteGradient", "NotDeclared", "NotFound",
    "PermissionDenied", "ProtocolError", "PushResult", "Request", "RowsPushResult",
    "ShapeError", "ShardStatus", "StaleGradient", "Table", "Tensor", "TesseraError",
    "Unavailable", "UnknownTable", "UnknownTensor",
    "WorkerStatus", "error_class", "load_job", "load_weights", "read_weights", "__version__",
]
