"""The job file, read by the C configuration layer (config/ts_config.c).

Python sees a job exactly as ps-server and ps-worker do: the same key table, defaults,
bounds and error messages, the same ``--set KEY=VALUE`` overrides and the same TF_CONFIG
rules, because the loader is theirs, compiled into the extension (it links libconfig and
cJSON, which deploy/install-deps.sh installs). A Python parser of libconfig would be a
second implementation to keep in step with every new key.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Union

from . import _client
from ._job_keys import KEYS, JobKeys


@dataclass(frozen=True)
class Job(JobKeys):
    """A loaded job: every key's value under its field name (``JobKeys``, generated from the
    key table: ``batch_size`` is train.batch_size, ``optimizer`` optimizer.name; ``KEYS``
    maps each key to its field; docs/configuration.md says what each means), and this
    process's identity."""

    task_role: str = ""                #: from TF_CONFIG's task.type ("" when not given)
    task_index: int = -1               #: from TF_CONFIG's task.index (-1 when not given)
    source: str = "-"                  #: the file it was read from
    #: the settings a job shares, as a worker's handshake sends them for the shards to
    #: compare with their own job file: [(key, value as the job file spells it)]
    job_settings: List[Tuple[str, str]] = field(default_factory=list)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def value(self, key: str) -> Any:
        """The value of a key as the job file names it ("train.batch_size")."""
        try:
            return getattr(self, KEYS[key])
        except KeyError:
            raise KeyError(f"{key!r} is not a key of a job file (docs/configuration.md)") \
                from None


def load_job(path: Optional[Union[str, "os.PathLike[str]"]] = None, overrides: Sequence[str] = (),
             tf_config: Optional[str] = None, use_env: bool = True) -> Job:
    """Load a job as ps-worker does: the defaults, then the file, then TF_CONFIG, then each
    override in order.

    Parameters
    ----------
    path : str or os.PathLike, optional
        The job file (None: none, the defaults and TF_CONFIG only).
    overrides : sequence of str, default ()
        ``"KEY=VALUE"`` overrides, as ``--set``.
    tf_config : str, optional
        A TF_CONFIG JSON text (default: the environment's, when ``use_env``).
    use_env : bool, default True
        Read TF_CONFIG from the environment when ``tf_config`` is None.

    Returns
    -------
    Job
        Every key's value, and this process's identity from TF_CONFIG.

    Raises
    ------
    ConfigError
        With the loader's message ("job.cfg:12: job.mode: must be one of ...").
    """
    if tf_config is None and use_env:
        tf_config = os.environ.get("TF_CONFIG")
    d = _client.load_config(None if path is None else os.fspath(path), tf_config,
                            list(overrides))
    return Job(**d)
