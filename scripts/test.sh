#!/usr/bin/env bash
# The test command (README "Set up", and all that .ci/run does): on a fresh Debian machine, as root, install
# everything the tests need -- apt packages, then the package and its test extra into .venv -- and run ruff,
# mypy and the whole suite. Any failure, including pytest's "no tests ran" (exit 5), fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v tmux >/dev/null 2>&1 || need+=(tmux)
[ -x /usr/bin/python3 ] || need+=(python3)  # the test fleet's hosts run the helper with the system python3
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# npm fetches the real Claude Code binary for the inbox-lane tests (cached in ~/.cache/drover-test).
command -v npm >/dev/null 2>&1 || need+=(npm)
# The login shells drover's one-line bootstrap must mean the same in (test users per shell on the sshd fleet).
for sh in zsh fish tcsh; do command -v "$sh" >/dev/null 2>&1 || need+=("$sh"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "+ apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python - <<'PY'
import sys
sys.path.insert(0, "tests/support")
# The real agents the tests run, from npm, into ~/.cache/drover-test/ if they are missing there.
import claudelab, codexlab, geminilab
for name, lab in (("claude code", claudelab), ("codex", codexlab), ("gemini-cli", geminilab)):
    path, why = lab.ensure_binary()
    print(f"+ {name}:", path or f"cannot run here ({why}); its tests will say so")
PY
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

echo "+ ruff"
.venv/bin/ruff check drover tests bench
.venv/bin/ruff format --check drover tests bench
echo "+ mypy"
.venv/bin/mypy drover tests
echo "+ pytest"
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest ran no test: that is a failure" >&2
  exit 1
fi
# A few failures (at most RERUN_MAX) are run once more, alone, on a quiet machine: the suite drives real agents,
# sshd and tmux on two cores, and a test that lost a race with the load once must not sink the run, but a test
# that fails again fails the command. Every test that passed only the second time is named, as FLAKY, so that it
# is fixed rather than forgotten. More failures than that are a real breakage: no second chance.
lastfailed=.pytest_cache/v/cache/lastfailed
if [ "$rc" -eq 1 ] && [ -s "$lastfailed" ]; then
  failed=$(.venv/bin/python -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$lastfailed")
  if [ "$failed" -ge 1 ] && [ "$failed" -le "${RERUN_MAX:-5}" ]; then
    cp "$lastfailed" .pytest_cache/first-failed.json
    echo "+ pytest: $failed failed; running them once more, alone, to tell a flake from a failure"
    set +e
    .venv/bin/python -m pytest -q --last-failed --last-failed-no-failures none "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
      .venv/bin/python - <<'PY'
import json
for name in json.load(open(".pytest_cache/first-failed.json")):
    print(f"FLAKY (failed once, passed alone): {name}")
PY
    fi
  fi
fi
exit "$rc"
