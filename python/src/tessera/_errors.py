"""Exceptions of tessera: one class per kind of failure, each carrying the library's code.

Every error the C library reports is raised as an instance of :class:`TesseraError` (or a
subclass), with ``.code`` (the negative ``TS_CLIENT_E*`` number of include/tessera/client.h,
or ``-errno`` for a failed connect), ``.name`` (``"ETIMEDOUT"``) and the library's message
(naming the shard) as its text.

=====================  ==============================================  ====================
class                  codes                                           also a
=====================  ==============================================  ====================
ShapeError             ESHAPE, ESIZE; arrays of the wrong size          ValueError
UnknownTensor          ENOTENSOR (alias: NotFound)                      KeyError
UnknownTable           ENOTABLE (a table the model did not declare)     KeyError
NotDeclared            ENOTDECLARED, ENOTREADY (initial values not set)
Unavailable            EUNAVAIL, ECLOSED, -errno (connect failures)     ConnectionError
DeadlineExceeded       ETIMEDOUT (a subclass of Unavailable)            TimeoutError
AuthError              EAUTH
PermissionDenied       EPERM (a subclass of AuthError)                  PermissionError
Interrupted            ESHUTDOWN (client interrupted or closed)
InvalidArgument        EINVAL                                           ValueError
NonFiniteGradient      ENONFINITE                                       ValueError
StaleGradient          ESTALE, EFUTURE
ConfigError            ECONFIG (job file, TF_CONFIG, token file)        ValueError
ProtocolError          EPROTO, EVERSION, EINCOMPLETE, ETOOBIG, EDATA
Busy                   EBUSY
TesseraError           anything else (EINTERNAL, ENOMEM, EROLE, ...)
=====================  ==============================================  ====================
"""
from __future__ import annotations

import errno as _errno
from typing import Dict, Type

from . import _client

#: code -> "ENAME", for every TS_CLIENT_E* code.
CODE_NAMES: Dict[int, str] = {
    getattr(_client, n): n for n in dir(_client) if n.startswith("E") and n[1:].isupper()
}


class TesseraError(Exception):
    """A failure reported by the Tessera client library.

    Attributes:
        code: the library's error code (negative), 0 when raised by the Python layer.
        name: the code's name ("ETIMEDOUT"), or the errno name for -errno codes.
        message: the library's explanation, naming the shard when one is concerned.
    """

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code
        self.message = message
        if code in CODE_NAMES:
            self.name = CODE_NAMES[code]
        elif code < 0 and -code in _errno.errorcode:
            self.name = _errno.errorcode[-code]
        else:
            self.name = "UNKNOWN" if code else ""

    def __str__(self) -> str:
        return f"{self.message} [{self.name}]" if self.name else self.message


class ShapeError(TesseraError, ValueError):
    """A tensor or array whose shape or size differs from the declared model."""


class UnknownTensor(TesseraError, KeyError):
    """A tensor (or partition) the shards do not know."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the plain message
        return TesseraError.__str__(self)


NotFound = UnknownTensor


class UnknownTable(TesseraError, KeyError):
    """An embedding table the model did not declare."""

    def __str__(self) -> str:
        return TesseraError.__str__(self)


class NotDeclared(TesseraError):
    """No model declared (or a shard lost it)."""


class Unavailable(TesseraError, ConnectionError):
    """A shard cannot be reached: no ready connection, connection lost, or the request's
    deadline passed while waiting for it (see DeadlineExceeded)."""


class DeadlineExceeded(Unavailable, TimeoutError):
    """The request's deadline (Client(timeout=...)) passed: a shard stopped answering."""


class AuthError(TesseraError):
    """The shards refused the handshake's token."""


class PermissionDenied(AuthError, PermissionError):
    """The request needs an admin client."""


class Interrupted(TesseraError):
    """The client was interrupted (Client.interrupt) or is closing."""


class InvalidArgument(TesseraError, ValueError):
    """The library refused an argument."""


class NonFiniteGradient(TesseraError, ValueError):
    """A gradient holds NaN or Inf."""


class StaleGradient(TesseraError):
    """A push's step is too old or ahead of the shard's parameters."""


class ConfigError(TesseraError, ValueError):
    """The job file, an override, TF_CONFIG or a token file is invalid."""


class ProtocolError(TesseraError):
    """The shard and the client do not understand each other."""


class Busy(TesseraError):
    """The client is busy with something that excludes this call."""


_BY_NAME: Dict[str, Type[TesseraError]] = {
    "ESHAPE": ShapeError, "ESIZE": ShapeError,
    "ENOTENSOR": UnknownTensor, "ENOTABLE": UnknownTable, "ENOTDECLARED": NotDeclared, "ENOTREADY": NotDeclared,
    "EUNAVAIL": Unavailable, "ECLOSED": Unavailable, "ETIMEDOUT": DeadlineExceeded,
    "EAUTH": AuthError, "EPERM": PermissionDenied,
    "ESHUTDOWN": Interrupted, "EINVAL": InvalidArgument, "ENONFINITE": NonFiniteGradient,
    "ESTALE": StaleGradient, "EFUTURE": StaleGradient, "ECONFIG": ConfigError,
    "EPROTO": ProtocolError, "EVERSION": ProtocolError, "EINCOMPLETE": ProtocolError,
    "ETOOBIG": ProtocolError, "EDATA": ProtocolError, "EBUSY": Busy,
}

#: code -> exception class, for every code with a class of its own.
ERRORS: Dict[int, Type[TesseraError]] = {
    getattr(_client, n): cls for n, cls in _BY_NAME.items()
}


def error_class(code: int) -> Type[TesseraError]:
    """The exception class raised for a library error code."""
    if code in ERRORS:
        return ERRORS[code]
    if code < 0 and -code < 30000:  # -errno: a failed connect, a refused address
        return Unavailable
    return TesseraError


def from_code(code: int, message: str) -> TesseraError:
    """The exception for a library error (called by the C extension)."""
    return error_class(code)(message, code)


_client.set_error_factory(from_code)
