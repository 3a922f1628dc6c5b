#!/bin/sh
# Creates a test CA and node certificates for troupe's mutual TLS (examples
# and tests only; never for production). Idempotent: files that exist are
# kept. EC P-256 keys, so it runs in a fraction of a second.
#
#   scripts/make_test_certs.sh DIR
#
# DIR/ca.pem, ca.key            the test CA
# DIR/node.pem, node.key        a node certificate signed by it
# DIR/node2.pem, node2.key      a second one
# DIR/encrypted.key, .pem       a node key encrypted with passphrase "troupe-test"
# DIR/rogue-ca.pem, rogue.pem, rogue.key   another CA and a node signed by it
set -eu
dir=${1:?usage: make_test_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
days=3650

make_ca() { # name
  [ -f "$1.pem" ] && return 0
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -out "$1.pem" \
    -days $days -subj "/CN=troupe test $1" 2>/dev/null
}

make_node() { # name ca [passphrase]
  [ -f "$1.pem" ] && return 0
  if [ $# -ge 3 ]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -aes-128-cbc -pass "pass:$3" \
      -out "$1.key" 2>/dev/null
    openssl req -new -key "$1.key" -passin "pass:$3" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  else
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$1.key" -out "$1.csr" \
      -subj "/CN=$1" 2>/dev/null
  fi
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" -days $days \
    2>/dev/null
  rm -f "$1.csr"
}

make_ca ca
make_ca rogue-ca
make_node node ca
make_node node2 ca
make_node encrypted ca troupe-test
make_node rogue rogue-ca
chmod 600 ./*.key
