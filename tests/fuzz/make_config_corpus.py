#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_config (tests/fuzz/corpus/config/): sections separated by
0xff bytes: job file text, TF_CONFIG (absent = unset), then --set overrides. Each file's
name starts with "config-", so that no two files of the repository share a name. Run from
the repository root."""
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/config"
os.makedirs(out, exist_ok=True)
with open("deploy/local/cluster.cfg", "rb") as f:
    demo = f.read()

SMALL = b'cluster = { ps = ["127.0.0.1:7100"]; workers = ["127.0.0.1:9200"]; };\n'
TF_PS = (b'{"cluster":{"ps":["10.0.0.1:7100","10.0.0.2:7100"],'
         b'"worker":["10.0.0.3:9200","10.0.0.4:9200"]},"task":{"type":"ps","index":1}}')
TF_WORKER = b'{"cluster":{"worker":["h1:9200"]},"task":{"type":"worker","index":0},"environment":"cloud"}'


def case(job, tf=None, *overrides):
    parts = [job]
    if tf is not None or overrides:
        parts.append(tf if tf is not None else b"")
    parts.extend(overrides)
    return b"\xff".join(parts)


cases = {
    # Valid jobs.
    "01-demo": case(demo),
    "02-empty": case(b""),
    "03-small": case(SMALL),
    "04-demo-tf-ps": case(demo, TF_PS),
    "05-small-tf-worker": case(SMALL, TF_WORKER),
    "06-demo-overrides": case(demo, b"", b"train.max_steps=200", b"job.mode=async",
                              b"model.layers=[784, 10]", b"checkpoint.dir="),
    "07-ssp-momentum": case(b'job = { mode = "ssp"; staleness = 0; };\n'
                            b'optimizer = { name = "momentum"; momentum = 0.5; learning_rate = 1; };\n'
                            b'model = { activation = "tanh"; layers = (784, 1048576, 10); };\n'),
    "08-ipv6-and-names": case(b'cluster = { ps = ["[::1]:7100", "ps-0.example_x:7101"];\n'
                              b'  ps_http = ["[fe80::1%eth0]:9100", "localhost:9101"];\n'
                              b'  workers = ["w0:1", "w1:65535"]; };\n'),
    "09-big-ints": case(b'server = { max_message_bytes = 17179869184; };\n'
                        b'job = { partition_bytes = 0x40000000; };\n'
                        b'model = { seed = 9223372036854775807; };\ntrain = { max_steps = 1L; };\n'),
    "10-comments": case(b'/* block\n comment */ job = { // line\n mode = "async"; # hash\n'
                        b' replicas_to_aggregate = 1; };\n'),
    # Bad jobs.
    "20-unknown-key": case(b'job = { moed = "sync"; };\n'),
    "21-unknown-section": case(b'jbo = { mode = "sync"; };\n'),
    "22-wrong-type-int": case(b'train = { batch_size = "64"; };\n'),
    "23-wrong-type-float": case(b'job = { sync_timeout_s = "10"; };\n'),
    "24-wrong-type-bool": case(b'device = { allow_growth = 1; };\n'),
    "25-wrong-type-list": case(b'model = { layers = ["784", 10]; };\n'),
    "26-huge-int": case(b'model = { seed = 18446744073709551616; };\n'),
    "27-negative-int": case(b'train = { epochs = -2147483649; };\n'),
    "28-float-out-of-range": case(b'optimizer = { beta1 = 1.0; epsilon = 0; };\n'),
    "29-bad-enum": case(b'job = { mode = "fast"; };\n'),
    "30-bad-address": case(b'cluster = { ps = ["::1:7100"]; };\n'),
    "31-port-zero": case(b'cluster = { workers = ["h:0", "h:99999"]; };\n'),
    "32-duplicate-address": case(b'cluster = { ps = ["h:1"]; workers = ["h:1"]; };\n'),
    "33-ps-http-count": case(b'cluster = { ps = ["h:1", "h:2"]; ps_http = ["h:3"]; };\n'),
    "34-replicas-too-many": case(SMALL + b'job = { replicas_to_aggregate = 2; };\n'),
    "35-heartbeat-order": case(b'job = { heartbeat_interval_s = 5; heartbeat_timeout_s = 5.0; };\n'),
    "36-partition-over-message": case(b'job = { partition_bytes = 1073741824; };\n'
                                      b'server = { max_message_bytes = 1048576; };\n'),
    "37-not-multiple": case(b'job = { partition_bytes = 6; };\n'),
    "38-section-not-group": case(b'job = 3;\n'),
    "39-key-at-top": case(b'mode = "sync";\n'),
    "40-syntax-error": case(b'job = { mode = "sync" }\n'),
    "41-nul-byte": case(b'job = { mode = "sync"; };\x00\n'),
    "42-include": case(b'@include "other.cfg"\n'),
    "43-too-many-layers": case(b'model = { layers = [' + b", ".join([b"1"] * 65) + b"]; };\n"),
    "44-one-layer": case(b'model = { layers = [10]; };\n'),
    "45-long-path": case(b'train = { logdir = "' + b"a" * 4096 + b'"; };\n'),
    "46-placement": case(b'device = { placement = "gpu:0"; memory_fraction = 1.5; };\n'),
    "46-placement-rules": case(SMALL + b'device = { placement = ""; rules = ["fc2=/cpu:0", '
                               b'"conv*=/gpu:0", "=/cpu:0"]; };\n'),
    "46-placement-rules-ok": case(SMALL + b'device = { rules = ["fc2=/cpu:0", "input/*=/cpu:0"]; };\n'),
    "47-long-key": case(b'job = { ' + b"k" * 200 + b' = 1; };\n'),
    "48-string-escapes": case(b'data = { train_images = "a\\"b\\\\c\\n#\\x41"; };\n'),
    # libconfig 1.5 leaks the string tokens a syntax error discards (see fuzz_config.c).
    "49-discarded-string": case(b'cluster = { workers = [7.10"2.0.2:9200"]; };\n'),
    "50-discarded-empty-string": case(b'job ""; "";\n'),
    # TF_CONFIG.
    "60-tf-not-json": case(SMALL, b'{"cluster":'),
    "61-tf-not-object": case(SMALL, b'[1, 2]'),
    "62-tf-chief": case(SMALL, b'{"cluster":{"chief":["h:1"]}}'),
    "63-tf-index-range": case(SMALL, b'{"task":{"type":"worker","index":3}}'),
    "64-tf-index-float": case(SMALL, b'{"task":{"type":"ps","index":0.5}}'),
    "65-tf-bad-type": case(SMALL, b'{"task":{"type":"evaluator","index":0}}'),
    "66-tf-ps-not-strings": case(SMALL, b'{"cluster":{"ps":[7100]}}'),
    "67-tf-blank": case(SMALL, b'  \n '),
    # Overrides.
    "80-set-no-equals": case(SMALL, None, b"train.max_steps"),
    "81-set-unknown": case(SMALL, None, b"train.max_step=3"),
    "82-set-section": case(SMALL, None, b"job={mode=\"sync\";}"),
    "83-set-bad-value": case(SMALL, None, b"train.batch_size=[1,"),
    "84-set-two-values": case(SMALL, None, b"train.batch_size=1; x = 2"),
    "85-set-quoted": case(SMALL, None, b'job.mode="ssp"', b"job.staleness=0x10"),
    "86-set-big": case(SMALL, None, b"server.max_message_bytes=4294967296",
                       b"job.partition_bytes=4294967296"),
    "87-set-list": case(SMALL, None, b'cluster.workers=["a:1", "b:2"]',
                        b"job.replicas_to_aggregate=2"),
}
for name, data in cases.items():
    with open(os.path.join(out, "config-" + name), "wb") as f:
        f.write(data)
