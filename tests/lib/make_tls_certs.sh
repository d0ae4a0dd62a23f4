#!/usr/bin/env bash
# Test certificates for auth.tls, into DIR (created): a CA and what it signs, and the bad
# cases the TLS tests refuse. P-256 keys, made with the openssl command line.
#   ca.pem                   the job's CA
#   shard.pem/.key           a shard's: subjectAltName IP:127.0.0.1, DNS:localhost
#   client.pem/.key          a client's (workers, psctl)
#   expired.pem/.key         a shard's, signed by the CA, expired yesterday
#   elsewhere.pem/.key       a shard's, signed by the CA, naming another host only
#   other-ca.pem             another CA
#   other-client.pem/.key    a client's, signed by the other CA
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
q() { "$@" >/dev/null 2>&1 || { echo "make_tls_certs: failed: $*" >&2; exit 1; }; }
key() { q openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }
ca() { # name subject
  key "$1"
  q openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 3650 -subj "/CN=$2"
}
cert() { # name ca days san
  key "$1"
  q openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$4" > "$1.ext"
  q openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" \
    -days "$3" -extfile "$1.ext"
  rm -f "$1.csr" "$1.ext"
}
ca ca "Tessera test CA"
ca other-ca "Another CA"
cert shard ca 30 "IP:127.0.0.1,DNS:localhost"
cert client ca 30 "DNS:worker.test"
cert expired ca -1 "IP:127.0.0.1,DNS:localhost"
cert elsewhere ca 30 "DNS:elsewhere.example"
cert other-client other-ca 30 "DNS:worker.test"
chmod 600 ./*.key
