#!/usr/bin/env bash
# Run a command with a Docker daemon available, then put the machine back as it was.
#   .ci/with-docker.sh CMD...
# - Docker already running: runs CMD.
# - No Docker, root, and ../shared/scripts/docker-offline-setup.sh present (machines that reach
#   package indexes but no container registry): sets Docker up, runs CMD, tears Docker down.
# - Otherwise, under CI (CI set, as CI sets it): fails, since a docker stage that skips its
#   tests would pass without testing anything. Elsewhere (a user's run) runs CMD anyway; the
#   docker-marked tests then skip and say why.
# A daemon without Compose v2 stops here with one line: the tests would otherwise fail deep
# inside (`docker: unknown command: docker compose`).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
setup="$here/../shared/scripts/docker-offline-setup.sh"
teardown="$here/../shared/scripts/docker-offline-teardown.sh"

need_compose() {
  docker compose version >/dev/null 2>&1 && return 0
  echo "== docker: the daemon runs but Compose v2 is missing ('docker compose version' fails); install the docker-compose-plugin package" >&2
  return 1
}

if docker info >/dev/null 2>&1; then
  need_compose || exit 1
  exec "$@"
fi
if [ "$(id -u)" = 0 ] && [ -x "$setup" ]; then
  echo "== docker: offline setup ($setup)"
  trap 'echo "== docker: teardown"; bash "$teardown" >/dev/null 2>&1' EXIT
  bash "$setup" || { echo "docker setup failed" >&2; exit 1; }
  need_compose || exit 1
  "$@"
  exit $?
fi
if [ -n "${CI:-}" ]; then
  echo "== docker: not available and cannot be set up here (CI=$CI): the docker stage fails rather than skip" >&2
  exit 1
fi
echo "== docker: not available and cannot be set up here; docker tests will skip"
"$@"
