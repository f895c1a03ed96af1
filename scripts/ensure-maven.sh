#!/usr/bin/env bash
# Make sure Maven is available: it builds the Kafka Streams conformance harness (conformance/kafka)
# that `make test` compares versiq with. Installs it through apt-get when running as root on
# Debian/Ubuntu; otherwise says what to install and fails.
set -euo pipefail
if command -v mvn >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends maven
    command -v mvn >/dev/null 2>&1 && exit 0
fi
echo "Maven (mvn) is required to build conformance/kafka: install it (Debian/Ubuntu: apt-get install maven)" >&2
exit 1
