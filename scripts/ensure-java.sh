#!/usr/bin/env bash
# Make sure a Java 17+ runtime is available for PySpark (used by `make demo` and `make test`).
# Installs a headless JRE through apt-get when running as root on Debian/Ubuntu; otherwise says
# exactly what to install and fails.
set -euo pipefail

MIN_MAJOR=17

java_major() {
    local java_bin=java
    if [ -n "${JAVA_HOME:-}" ] && [ -x "${JAVA_HOME}/bin/java" ]; then
        java_bin="${JAVA_HOME}/bin/java"
    fi
    command -v "$java_bin" >/dev/null 2>&1 || { echo 0; return; }
    # `java -version` prints e.g.: openjdk version "17.0.15" 2025-04-15  (or "1.8.0_392" for 8)
    local version
    version=$("$java_bin" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)
    case "$version" in
        1.*) version=${version#1.} ;;
    esac
    version=${version%%[.+-]*}
    case "$version" in
        ''|*[!0-9]*) echo 0 ;;
        *) echo "$version" ;;
    esac
}

major=$(java_major)
if [ "$major" -ge "$MIN_MAJOR" ]; then
    echo "Java $major found (PySpark needs $MIN_MAJOR+)."
    exit 0
fi
if [ "$major" -gt 0 ]; then
    echo "Java $major found, but PySpark 4 needs Java $MIN_MAJOR or later." >&2
else
    echo "No Java runtime found; PySpark needs Java $MIN_MAJOR or later." >&2
fi

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    for package in openjdk-17-jre-headless openjdk-21-jre-headless; do
        candidate=$(apt-cache policy "$package" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
        if [ -n "$candidate" ] && [ "$candidate" != "(none)" ]; then
            echo "Installing $package $candidate with apt-get ..."
            apt-get install -y -qq --no-install-recommends "$package"
            major=$(java_major)
            if [ "$major" -ge "$MIN_MAJOR" ]; then
                echo "Java $major installed."
                exit 0
            fi
        fi
    done
    echo "apt-get could not install a Java $MIN_MAJOR+ runtime." >&2
fi

cat >&2 <<MSG
Install a Java $MIN_MAJOR+ runtime (17 or 21), then run make again:
  Debian/Ubuntu:  sudo apt-get install openjdk-17-jre-headless
  Fedora/RHEL:    sudo dnf install java-17-openjdk-headless
  macOS:          brew install openjdk@17
or point JAVA_HOME at an existing Java $MIN_MAJOR+ installation. Check with: java -version
MSG
exit 1
