# Shared set-up for scripts/test and scripts/serve: system packages, then a venv.
# Sourced, not run. Installs only what is missing, so a second run is quick.
set -euo pipefail

sandman_system_packages() {
    local need=()
    command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
    command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)  # egress-allow sandboxes
    command -v ip >/dev/null 2>&1 || need+=(iproute2)  # the egress tests' own test host
    command -v git >/dev/null 2>&1 || need+=(git)
    # The sample task set's suites run the image's python3 -m pytest (grading/samples.py).
    /usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || need+=(python3-pytest)
    # The live-push tests across replicas start a real Redis (Channels layer).
    command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
    if [ "${SANDMAN_NEED_BROWSER:-1}" = "1" ]; then
        command -v chromium >/dev/null 2>&1 || need+=(chromium)
    fi
    if [ ${#need[@]} -gt 0 ]; then
        if [ "$(id -u)" = "0" ]; then
            echo "setup: apt-get install ${need[*]}"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
        else
            echo "setup: missing ${need[*]} and not root; tests that need them will be skipped" >&2
        fi
    fi
}

sandman_venv() {
    local venv="${SANDMAN_VENV:-.venv}"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test,agents,fast]"
    PY="$venv/bin/python"
    export PY
}
