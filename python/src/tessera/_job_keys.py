# Generated from the key table (config/ts_config.c) by
#   build/config/ts-config-reference --python > python/src/tessera/_job_keys.py
# Do not edit: the config_python unit test fails while this file is not what the table
# makes.
"""Every key of a job file, one typed field each (docs/configuration.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

#: key of a job file -> the field of JobKeys that holds its value
KEYS: Dict[str, str] = {
    "cluster.ps": "ps",
    "cluster.ps_http": "ps_http",
    "cluster.workers": "workers",
    "job.mode": "mode",
    "job.replicas_to_aggregate": "replicas_to_aggregate",
    "job.staleness": "staleness",
    "job.sync_timeout_s": "sync_timeout_s",
    "job.start_timeout_s": "start_timeout_s",
    "job.name": "job_name",
    "job.min_workers": "min_workers",
    "job.heartbeat_timeout_s": "heartbeat_timeout_s",
    "job.heartbeat_interval_s": "heartbeat_interval_s",
    "job.connect_timeout_s": "connect_timeout_s",
    "job.busy_poll_us": "busy_poll_us",
    "job.partition_bytes": "partition_bytes",
    "server.max_message_bytes": "max_message_bytes",
    "server.max_connections": "max_connections",
    "server.max_preauth_connections": "max_preauth_connections",
    "server.handshake_timeout_s": "handshake_timeout_s",
    "server.max_handshake_bytes": "max_handshake_bytes",
    "server.frame_grace_s": "frame_grace_s",
    "server.min_recv_bytes_per_s": "min_recv_bytes_per_s",
    "server.push_min_bytes_per_s": "push_min_bytes_per_s",
    "server.push_rate_window_s": "push_rate_window_s",
    "server.push_contended_min_bytes_per_s": "push_contended_min_bytes_per_s",
    "server.pull_hold_timeout_s": "pull_hold_timeout_s",
    "server.max_reply_bytes_per_connection": "max_reply_bytes_per_connection",
    "server.max_reply_bytes": "max_reply_bytes",
    "server.max_status_reply_bytes": "max_status_reply_bytes",
    "server.reply_full_timeout_s": "reply_full_timeout_s",
    "server.max_parked_pulls": "max_parked_pulls",
    "server.push_dedup_clients": "push_dedup_clients",
    "server.max_pull_wait_s": "max_pull_wait_s",
    "server.max_model_bytes": "max_model_bytes",
    "server.max_table_bytes": "max_table_bytes",
    "http.max_connections": "http_max_connections",
    "http.max_connections_per_ip": "http_max_connections_per_ip",
    "http.request_timeout_s": "http_request_timeout_s",
    "optimizer.name": "optimizer",
    "optimizer.learning_rate": "learning_rate",
    "optimizer.momentum": "momentum",
    "optimizer.beta1": "beta1",
    "optimizer.beta2": "beta2",
    "optimizer.epsilon": "epsilon",
    "optimizer.decay": "decay",
    "optimizer.decay_steps": "decay_steps",
    "optimizer.decay_rate": "decay_rate",
    "optimizer.staircase": "staircase",
    "optimizer.decay_alpha": "decay_alpha",
    "model.layers": "layers",
    "model.activation": "activation",
    "model.seed": "seed",
    "data.format": "data_format",
    "data.train_images": "train_images",
    "data.train_labels": "train_labels",
    "data.test_images": "test_images",
    "data.test_labels": "test_labels",
    "data.train_path": "train_path",
    "data.test_path": "test_path",
    "train.batch_size": "batch_size",
    "train.epochs": "epochs",
    "train.state_every": "state_every",
    "train.max_steps": "max_steps",
    "train.logdir": "logdir",
    "train.run_name": "run_name",
    "train.log_interval_s": "log_interval_s",
    "train.stall_timeout_s": "stall_timeout_s",
    "device.placement": "placement",
    "device.rules": "placement_rules",
    "device.allow_soft_placement": "allow_soft_placement",
    "device.log_device_placement": "log_device_placement",
    "device.allow_growth": "allow_growth",
    "device.memory_fraction": "memory_fraction",
    "device.towers": "towers",
    "device.intra_op_parallelism_threads": "intra_op_threads",
    "device.allow_tf32": "allow_tf32",
    "checkpoint.dir": "checkpoint_dir",
    "checkpoint.interval_s": "checkpoint_interval_s",
    "checkpoint.keep": "checkpoint_keep",
    "checkpoint.full_every": "checkpoint_full_every",
    "checkpoint.sign": "checkpoint_sign",
    "checkpoint.restore_from": "checkpoint_restore_from",
    "auth.token_file": "token_file",
    "auth.admin_token_file": "admin_token_file",
    "auth.tls": "tls",
    "auth.tls_ca_file": "tls_ca_file",
    "auth.tls_cert_file": "tls_cert_file",
    "auth.tls_key_file": "tls_key_file",
}


@dataclass(frozen=True)
class JobKeys:
    """The value of every key of a loaded job, under its field name (the key's
    last part, or the name KEYS gives)."""

    ps: List[str]  #: cluster.ps
    ps_http: List[str]  #: cluster.ps_http
    workers: List[str]  #: cluster.workers
    mode: str  #: job.mode
    replicas_to_aggregate: int  #: job.replicas_to_aggregate
    staleness: int  #: job.staleness
    sync_timeout_s: float  #: job.sync_timeout_s
    start_timeout_s: float  #: job.start_timeout_s
    job_name: str  #: job.name
    min_workers: int  #: job.min_workers
    heartbeat_timeout_s: float  #: job.heartbeat_timeout_s
    heartbeat_interval_s: float  #: job.heartbeat_interval_s
    connect_timeout_s: float  #: job.connect_timeout_s
    busy_poll_us: int  #: job.busy_poll_us
    partition_bytes: int  #: job.partition_bytes
    max_message_bytes: int  #: server.max_message_bytes
    max_connections: int  #: server.max_connections
    max_preauth_connections: int  #: server.max_preauth_connections
    handshake_timeout_s: float  #: server.handshake_timeout_s
    max_handshake_bytes: int  #: server.max_handshake_bytes
    frame_grace_s: float  #: server.frame_grace_s
    min_recv_bytes_per_s: int  #: server.min_recv_bytes_per_s
    push_min_bytes_per_s: int  #: server.push_min_bytes_per_s
    push_rate_window_s: float  #: server.push_rate_window_s
    push_contended_min_bytes_per_s: int  #: server.push_contended_min_bytes_per_s
    pull_hold_timeout_s: float  #: server.pull_hold_timeout_s
    max_reply_bytes_per_connection: int  #: server.max_reply_bytes_per_connection
    max_reply_bytes: int  #: server.max_reply_bytes
    max_status_reply_bytes: int  #: server.max_status_reply_bytes
    reply_full_timeout_s: float  #: server.reply_full_timeout_s
    max_parked_pulls: int  #: server.max_parked_pulls
    push_dedup_clients: int  #: server.push_dedup_clients
    max_pull_wait_s: float  #: server.max_pull_wait_s
    max_model_bytes: int  #: server.max_model_bytes
    max_table_bytes: int  #: server.max_table_bytes
    http_max_connections: int  #: http.max_connections
    http_max_connections_per_ip: int  #: http.max_connections_per_ip
    http_request_timeout_s: float  #: http.request_timeout_s
    optimizer: str  #: optimizer.name
    learning_rate: float  #: optimizer.learning_rate
    momentum: float  #: optimizer.momentum
    beta1: float  #: optimizer.beta1
    beta2: float  #: optimizer.beta2
    epsilon: float  #: optimizer.epsilon
    decay: str  #: optimizer.decay
    decay_steps: int  #: optimizer.decay_steps
    decay_rate: float  #: optimizer.decay_rate
    staircase: bool  #: optimizer.staircase
    decay_alpha: float  #: optimizer.decay_alpha
    layers: List[int]  #: model.layers
    activation: str  #: model.activation
    seed: int  #: model.seed
    data_format: str  #: data.format
    train_images: str  #: data.train_images
    train_labels: str  #: data.train_labels
    test_images: str  #: data.test_images
    test_labels: str  #: data.test_labels
    train_path: str  #: data.train_path
    test_path: str  #: data.test_path
    batch_size: int  #: train.batch_size
    epochs: int  #: train.epochs
    state_every: int  #: train.state_every
    max_steps: int  #: train.max_steps
    logdir: str  #: train.logdir
    run_name: str  #: train.run_name
    log_interval_s: float  #: train.log_interval_s
    stall_timeout_s: float  #: train.stall_timeout_s
    placement: str  #: device.placement
    placement_rules: List[str]  #: device.rules
    allow_soft_placement: bool  #: device.allow_soft_placement
    log_device_placement: bool  #: device.log_device_placement
    allow_growth: bool  #: device.allow_growth
    memory_fraction: float  #: device.memory_fraction
    towers: int  #: device.towers
    intra_op_threads: int  #: device.intra_op_parallelism_threads
    allow_tf32: bool  #: device.allow_tf32
    checkpoint_dir: str  #: checkpoint.dir
    checkpoint_interval_s: float  #: checkpoint.interval_s
    checkpoint_keep: int  #: checkpoint.keep
    checkpoint_full_every: int  #: checkpoint.full_every
    checkpoint_sign: bool  #: checkpoint.sign
    checkpoint_restore_from: List[str]  #: checkpoint.restore_from
    token_file: str  #: auth.token_file
    admin_token_file: str  #: auth.admin_token_file
    tls: bool  #: auth.tls
    tls_ca_file: str  #: auth.tls_ca_file
    tls_cert_file: str  #: auth.tls_cert_file
    tls_key_file: str  #: auth.tls_key_file
