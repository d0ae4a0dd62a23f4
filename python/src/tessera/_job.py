"""The job file, read by the C configuration layer (config/ts_config.c).

Python sees a job exactly as ps-server and ps-worker do: the same key table, defaults,
bounds and error messages, the same ``--set KEY=VALUE`` overrides and the same TF_CONFIG
rules, because the loader is theirs, compiled into the extension (it links libconfig and
cJSON, which deploy/install-deps.sh installs). A Python parser of libconfig would be a
second implementation to keep in step with every new key.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import List, Optional, Sequence, Tuple, Union

from . import _client


@dataclass(frozen=True)
class Job:
    """A loaded job (docs/configuration.md names every key)."""

    ps: List[str]                      #: cluster.ps: "host:port" of each shard
    ps_http: List[str]
    workers: List[str]                 #: cluster.workers; its length is the worker count
    mode: str                          #: job.mode: "sync", "async" or "ssp"
    replicas_to_aggregate: int
    staleness: int
    sync_timeout_s: float
    heartbeat_timeout_s: float
    heartbeat_interval_s: float
    busy_poll_us: int
    partition_bytes: int
    max_message_bytes: int
    max_connections: int
    optimizer: str
    learning_rate: float
    momentum: float
    beta1: float
    beta2: float
    epsilon: float
    layers: List[int]
    seed: int
    batch_size: int
    epochs: int
    max_steps: int
    logdir: str
    log_interval_s: float
    state_every: int                   #: train.state_every: steps between state pushes
    checkpoint_dir: str
    checkpoint_interval_s: float
    checkpoint_keep: int
    token_file: str                    #: auth.token_file ("" = no token)
    admin_token_file: str
    task_role: str                     #: from TF_CONFIG's task.type ("" when not given)
    task_index: int                    #: from TF_CONFIG's task.index (-1 when not given)
    source: str = field(default="-")   #: the file it was read from
    #: the settings a job shares, as a worker's handshake sends them for the shards to
    #: compare with their own job file: [(key, value as the job file spells it)]
    job_settings: List[Tuple[str, str]] = field(default_factory=list)

    @property
    def num_workers(self) -> int:
        return len(self.workers)


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
    names = {f.name for f in fields(Job)}
    return Job(**{k: v for k, v in d.items() if k in names})
