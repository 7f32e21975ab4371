#!/usr/bin/env bash
# A private Docker engine for gyre's docker sandbox on a machine without systemd or an image registry
# (CI, a developer's box): Debian's docker.io, `dockerd` started by hand on its own socket, data root and
# exec root, and a Debian base image built offline from Debian's packages (mmdebstrap + docker import),
# cached in the data root under a tag keyed by its package list (a changed list builds a new one) and
# tagged `gyre-base:local`, the name configs map unpullable images to (configs/tiny-docker.yaml).
# Facts and timings: ../shared/DEPENDENCIES.md of the project's workplace, docs/sandbox.md.
#
#   scripts/docker-engine.sh run CMD...   start the engine (or reuse one already up on the socket), run CMD
#                                          with DOCKER_HOST, GYRE_DOCKER_IMAGE and GYRE_REQUIRE_DOCKER=1 set,
#                                          stop the engine if this call started it; exits with CMD's status
#   scripts/docker-engine.sh start        start it and print the `export` lines for a shell (`make docker-engine`)
#   scripts/docker-engine.sh stop         stop the engine started by `start` (by the PID in its pidfile)
#
# As root (`make test`, CI) the engine is required, as bubblewrap and the browser are: an engine that cannot be
# installed, started or given its base image stops `run` before CMD, exit 1, with a line naming the engine and
# the reason (never a suite whose docker tests quietly skip). As another user it is best effort: `run` says
# why there is none on stderr and runs CMD without it; the docker tests then skip and name the reason.
set -uo pipefail

STATE=${GYRE_DOCKER_HOME:-/var/lib/gyre-docker}       # data root + image build cache: kept between runs
RUN=${GYRE_DOCKER_RUN:-/run/gyre-docker}              # socket, exec root, pidfile (short: unix socket paths)
SOCK="$RUN/docker.sock"
START_WAIT_S=30
STOP_WAIT_S=20
# libstdc++6 and ca-certificates: in every python:3.x-slim image (through apt), and numpy's wheels need the former.
# python3-tk and python3-gdbm: the standard library's tkinter and dbm.gnu, which python.org's build (python:3.x)
# holds and Debian splits out (six's real tests skip 14 cases without them: gyre bench fidelity --docker-image).
BASE_PACKAGES="python3,python-is-python3,python3-venv,python3-pip,python3-pytest,python3-tk,python3-gdbm,procps,libstdc++6,ca-certificates"
BASE_SUITE=bookworm
# The base stands in for python:3.x images (python.org's build, no PEP 668 marker): a task's runner that
# runs `pip install pytest==8.4.1` there must not meet Debian's "externally-managed-environment" here.
# /app exists, as in Terminal-Bench's base images (`COPY x /app` puts x in it, not a file named /app).
BASE_CUSTOMIZE='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED; mkdir -p "$1"/app'
LOCAL_TAG=gyre-base:local   # what configs name (`sandbox.docker.base_images`): the newest base built here
TBENCH_TAG=gyre-base:tbench # the same with WORKDIR /app, as Terminal-Bench's ghcr.io/laude-institute/t-bench/* end
BASE_TAG="gyre-base:$(printf '%s %s essential eatmydata %s' "$BASE_SUITE" "$BASE_PACKAGES" "$BASE_CUSTOMIZE" \
  | sha256sum | cut -c1-12)"
# The same with a C compiler and Python's headers, as python.org's full python:3.x images hold them (the slim
# ones do not): an NL2RepoBench project whose `pip install -e .` compiles an extension (markupsafe) builds there;
# configs/nl2repobench-docker.yaml names it. gyre bench fidelity --docker-image: markupsafe 0.0 on the base, 1.0 here.
BUILD_EXTRA="gcc,libc6-dev,python3-dev"
BUILD_TAG="gyre-base:build-$(printf '%s %s' "${BASE_TAG#gyre-base:}" "$BUILD_EXTRA" | sha256sum | cut -c1-12)"
BUILD_LOCAL_TAG=gyre-base:build   # what configs name: the newest such image built here

say() { echo "docker-engine: $*" >&2; }

answers() { DOCKER_HOST="unix://$SOCK" timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

install_engine() {
  command -v dockerd >/dev/null && command -v mmdebstrap >/dev/null && return 0
  if [ "$(id -u)" -ne 0 ]; then
    say "dockerd or mmdebstrap missing and not root: apt-get install -y --no-install-recommends docker.io mmdebstrap"
    return 1
  fi
  say "installing docker.io and mmdebstrap (apt)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      docker.io mmdebstrap; } >/dev/null 2>&1 || { say "apt-get install docker.io mmdebstrap failed"; return 1; }
}

start_engine() {
  if answers; then say "an engine already answers on $SOCK: reused"; STARTED=0; return 0; fi
  [ "$(id -u)" -eq 0 ] || { say "dockerd needs root; no engine"; return 1; }
  install_engine || return 1
  mkdir -p "$STATE/root" "$RUN/exec" 2>/dev/null && [ -w "$RUN" ] && [ -w "$STATE" ] \
    || { say "cannot write its directories $STATE and $RUN (GYRE_DOCKER_HOME, GYRE_DOCKER_RUN)"; return 1; }
  printf '{"deprecated-key-path": "%s/key.json"}\n' "$STATE" > "$STATE/daemon.json"
  say "starting dockerd on $SOCK (data root $STATE/root)"
  dockerd -H "unix://$SOCK" --data-root "$STATE/root" --exec-root "$RUN/exec" --pidfile "$RUN/docker.pid" \
    --config-file "$STATE/daemon.json" --storage-driver overlay2 --iptables=false --ip6tables=false \
    --bridge=none >"$STATE/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  echo "$DOCKERD_PID" > "$RUN/started-by-gyre.pid"
  for _ in $(seq $((START_WAIT_S * 5))); do
    answers && { say "dockerd up (pid $DOCKERD_PID)"; STARTED=1; return 0; }
    kill -0 "$DOCKERD_PID" 2>/dev/null || break
    sleep 0.2
  done
  say "dockerd did not answer within ${START_WAIT_S}s; its log ends:"; tail -5 "$STATE/dockerd.log" >&2
  stop_engine
  return 1
}

tag_flavours() {
  local out
  DOCKER_HOST="unix://$SOCK" docker tag "$BASE_TAG" "$LOCAL_TAG" || return 1
  DOCKER_HOST="unix://$SOCK" docker tag "$BUILD_TAG" "$BUILD_LOCAL_TAG" || return 1
  out=$(printf 'FROM %s\nWORKDIR /app\n' "$BASE_TAG" \
    | DOCKER_HOST="unix://$SOCK" docker build -q --network none -t "$TBENCH_TAG" - 2>&1) \
    || { say "could not tag $TBENCH_TAG: $out"; return 1; }
}

bootstrap() {  # bootstrap TAG PACKAGES: a Debian image of PACKAGES, built offline, imported as TAG
  local tar="$STATE/rootfs-$$.tar" rc
  if ! unshare -m --propagation private mmdebstrap --quiet --mode=root --variant=essential \
      --hook-dir=/usr/share/mmdebstrap/hooks/eatmydata --customize-hook="$BASE_CUSTOMIZE" \
      --include="$2" "$BASE_SUITE" "$tar" \
      >"$STATE/mmdebstrap.log" 2>&1; then
    say "mmdebstrap failed; its log ends:"; tail -5 "$STATE/mmdebstrap.log" >&2; rm -f "$tar"; return 1
  fi
  DOCKER_HOST="unix://$SOCK" docker import -c 'CMD ["bash"]' "$tar" "$1" >/dev/null
  rc=$?
  rm -f "$tar"
  [ $rc -eq 0 ] && say "image $1 built" || say "docker import of $1 failed"
  return $rc
}

build_base() {
  if DOCKER_HOST="unix://$SOCK" docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    say "base image $BASE_TAG cached"
  else
    say "building base image $BASE_TAG offline from Debian's packages ($BASE_PACKAGES; ~2-3 min)"
    bootstrap "$BASE_TAG" "$BASE_PACKAGES" || return 1
  fi
  if DOCKER_HOST="unix://$SOCK" docker image inspect "$BUILD_TAG" >/dev/null 2>&1; then
    say "base image with a compiler $BUILD_TAG cached"
  else
    say "building $BUILD_TAG: the base with $BUILD_EXTRA (~1 min)"
    bootstrap "$BUILD_TAG" "$BASE_PACKAGES,$BUILD_EXTRA" || return 1
  fi
  tag_flavours
}

stop_engine() {
  local pid
  pid=$(cat "$RUN/started-by-gyre.pid" 2>/dev/null) || { say "no engine started by this script"; return 0; }
  if kill -0 "$pid" 2>/dev/null; then
    DOCKER_HOST="unix://$SOCK" docker ps -aq --filter label=gyre 2>/dev/null | xargs -r \
      env DOCKER_HOST="unix://$SOCK" docker rm -f >/dev/null 2>&1
    kill -TERM "$pid"
    for _ in $(seq $((STOP_WAIT_S * 5))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { say "dockerd $pid did not stop in ${STOP_WAIT_S}s: SIGKILL"; kill -KILL "$pid"; }
    wait "$pid" 2>/dev/null
    say "dockerd stopped (pid $pid)"
  fi
  rm -f "$RUN/started-by-gyre.pid"
  # what a dockerd killed outright leaves mounted (overlays, its exec root), innermost first
  awk -v a="$STATE/root" -v b="$RUN" 'index($2, a) == 1 || index($2, b) == 1 { print $2 }' /proc/mounts \
    | sort -r | while read -r mount; do umount -l "$mount" && say "unmounted leftover $mount"; done
  return 0
}

env_lines() {
  echo "export DOCKER_HOST=unix://$SOCK"
  echo "export GYRE_DOCKER_IMAGE=$BASE_TAG"
  echo "export GYRE_REQUIRE_DOCKER=1"
}

case "${1:-}" in
  start)
    start_engine && build_base || exit 1
    env_lines
    ;;
  stop)
    stop_engine
    ;;
  run)
    shift
    STARTED=0
    if start_engine && build_base; then
      eval "$(env_lines)"
      if [ "$STARTED" = 1 ]; then trap stop_engine EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; fi
    else
      [ "$STARTED" = 1 ] && stop_engine
      if [ "$(id -u)" -eq 0 ]; then
        say "FAILED: the Docker engine (dockerd on $SOCK) could not be started or given its base image (the" \
            "lines above say why); the docker tests need it here: not running $*"
        exit 1
      fi
      say "no Docker engine (not root): the docker tests skip and say why"
    fi
    "$@"
    exit $?
    ;;
  *)
    echo "usage: $0 start | stop | run CMD..." >&2
    exit 2
    ;;
esac
