#!/usr/bin/env bash
# The system packages gyre needs beside its Python environment, installed the same way by `make test`,
# `make run` and CI (.ci/run calls `make test`). As root it installs what is missing with apt; as
# anyone else it stops with the one command that does.
#   bubblewrap       the local sandbox's namespaces (network, filesystem, PID); the attack suite needs it
#   util-linux       unshare + setpriv (sandboxed commands drop from root to an unprivileged uid)
#   libseccomp2      the sandbox's seccomp filter (pyseccomp loads libseccomp.so.2)
#   git              history scrubbing in sandboxes
#   libibverbs1 ibverbs-providers   what the Mooncake Transfer Engine's wheel links (TCP here, RDMA on a cluster)
#   chromium         the headless browser that reads run states off the Prefect UI (tests/test_deploy_prefect.py)
# Then, best effort, the real Claude Code CLI (pinned) for the live harness tests, which skip without it
# and say why: npm's registry may be unreachable.
set -euo pipefail
PACKAGES=(bubblewrap util-linux libseccomp2 git libibverbs1 ibverbs-providers chromium)
CLAUDE_CODE_VERSION=2.1.197

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v setpriv >/dev/null && command -v unshare >/dev/null || missing+=(util-linux)
command -v git >/dev/null || missing+=(git)
ldconfig -p | grep -q 'libseccomp.so.2' || missing+=(libseccomp2)
ldconfig -p | grep -q 'libibverbs.so.1' || missing+=(libibverbs1 ibverbs-providers)
command -v chromium >/dev/null || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "gyre needs system packages that are missing: ${missing[*]}" >&2
    echo "install them with: sudo apt-get install -y --no-install-recommends ${PACKAGES[*]}" >&2
    exit 1
  fi
  echo "installing system packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
fi

if [ "${GYRE_SKIP_CLAUDE_CODE:-0}" != 1 ] && command -v npm >/dev/null \
   && ! claude --version 2>/dev/null | grep -q "^$CLAUDE_CODE_VERSION "; then
  if [ "$(id -u)" -eq 0 ] || [ -w "$(npm prefix -g 2>/dev/null)/lib" ]; then
    timeout 300 npm install -g --silent "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >/dev/null 2>&1 \
      || echo "claude CLI $CLAUDE_CODE_VERSION not installed (npm's registry?): its live tests will skip"
  else
    echo "claude CLI $CLAUDE_CODE_VERSION not installed (npm install -g needs root here): its live tests will skip"
  fi
fi
