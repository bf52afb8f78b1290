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
exit "$rc"
