"""The user's OpenSSH master for a `transport = "openssh"` host: is it up, and opening it (`drover connect HOST`).

Masters are the user's: drover never opens one on its own (a cron job has nobody to type the code).  `drover
connect` runs the one ssh command that opens it on the person's terminal, the code typed by them and never
stored, then checks that the master answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import stat
import subprocess
from typing import Any

from drover.errors import TransportError
from drover.remote import protocol as P
from drover.transport.openssh_config import OpenSSHCommand, die_with_drover, socket_fits, ssh_env

UP, DOWN, STALE, HUNG = "up", "down", "stale", "not answering"


def find_master(socket: str) -> str:
    """A pgrep that finds the master on `socket`: one kept by ControlPersist (every `drover connect` opens one)
    renames itself `ssh: SOCKET [mux]`, so its `-M` is nowhere in what pgrep sees."""
    return "pgrep -af " + shlex.quote(re.escape(socket) + r" \[mux\]|ssh.* -M")


def master_fix(ssh: OpenSSHCommand) -> str:
    """What to do about a master that accepts and never answers: `drover connect` refuses to open another while it
    holds the socket, and `ssh -O exit` goes through that same socket, unanswered."""
    return (
        f"end that master: kill its process (`{find_master(ssh.control_socket())}` finds it; SIGKILL if it is "
        f"stopped) -- `ssh -O exit` goes through the socket it does not answer on -- then `drover connect "
        f"{ssh.host}` opens a new one"
    )


async def master_state(ssh: OpenSSHCommand, seconds: float) -> str:
    """`up`, `down` (no socket), `stale` (a socket nobody listens on: a master that died) or `not answering` (a
    master that accepts and never replies -- stopped, or wedged -- which would hold every call to its bound)."""
    # ssh -G (which runs the user's Match exec programs) off the loop and within the bound.
    path = await asyncio.to_thread(ssh.control_socket, seconds)
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return STALE
    except FileNotFoundError:
        return DOWN
    except OSError:
        return STALE
    proc = await asyncio.create_subprocess_exec(
        *ssh.check(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=ssh_env(),
        preexec_fn=die_with_drover,
    )
    # No pipes (all DEVNULL): wait() ends when ssh does, and leaves nothing for a closed loop to clean up.
    try:
        code = await asyncio.wait_for(proc.wait(), seconds)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 2)
        return HUNG
    except asyncio.CancelledError:  # the call it was asked for ended: its ssh must not wait on a hung master
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return UP if code == 0 else STALE


async def describe(ssh: OpenSSHCommand, seconds: float) -> dict[str, Any]:
    """What `fleet check` says of the master: its state, its socket, and the command that opens it."""
    await asyncio.to_thread(ssh.resolved, seconds)
    state = await master_state(ssh, seconds)
    row: dict[str, Any] = {"master": state, "control_path": ssh.control_socket(), "connect": ssh.connect_line()}
    blocked = not_drovers_to_remove(ssh, row["control_path"]) if state == STALE else None
    if blocked:
        row["master_blocked"] = f"{blocked} ({BLOCKED_FIX})"
    user = ssh.user_control_path()
    if user and not socket_fits(user):
        row["control_path_note"] = (
            f"your ControlPath {user} is {len(user.encode())} bytes: with the 17 bytes ssh adds while creating it, "
            f"over the socket limit; drover uses {ssh.control_path()} instead (a shorter one in ~/.ssh/config, "
            "e.g. ControlPath ~/.ssh/cm-%C, serves your own ssh too)"
        )
    return row


BLOCKED_FIX = "move it away, or point ControlPath (in ~/.ssh/config) somewhere else"


def not_drovers_to_remove(ssh: OpenSSHCommand, path: str) -> str | None:
    """What is at the ControlPath when it is not a socket of this user's (which `drover connect` refuses to
    remove): said by fleet check too, which must not offer `drover connect` for it."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid():
        return None
    what = "a socket of another user" if stat.S_ISSOCK(st.st_mode) else "not a socket"
    return f"the ControlPath {path} for {ssh.host} is {what}: drover will not remove it to open a master there"


def remove_dead_socket(ssh: OpenSSHCommand, path: str) -> None:
    """ssh -M refuses to replace an existing socket ("already exists, disabling multiplexing") and would open a
    master nobody can reach: a dead master's socket goes first.  Only a socket of this user's: anything else at
    the ControlPath (a file of theirs, a symlink, another user's socket) is not drover's to delete."""
    blocked = not_drovers_to_remove(ssh, path)
    if blocked:
        raise TransportError(blocked, host=ssh.host, code=P.NO_MASTER, hint=BLOCKED_FIX)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def connect(ssh: OpenSSHCommand, seconds: float, say: Any) -> str:
    """Open the master on this terminal (the person types the second factor).  Returns the state after."""
    ssh.resolved()
    state = asyncio.run(master_state(ssh, seconds))
    path = ssh.control_socket()
    if state == UP:
        say(f"a master for {ssh.host} is already up ({path})")
        return state
    if state == HUNG:
        raise TransportError(
            f"the master at {path} accepts connections but does not answer (stopped or wedged)",
            host=ssh.host,
            code=P.NO_MASTER,
            hint=master_fix(ssh),
        )
    if state == STALE:
        remove_dead_socket(ssh, path)
    say(f"opening the master: {ssh.connect_line()}")
    # The terminal is inherited (no pipes): the prompt is the person's, and the master, once in the background,
    # holds nothing of drover's.
    done = subprocess.run(ssh.connect(), check=False)
    if done.returncode != 0:
        raise TransportError(
            f"ssh exited with status {done.returncode}: no master was opened for {ssh.host}",
            host=ssh.host,
            code=P.NO_MASTER,
            hint="its message above says why; `ssh -v` with the same command shows more",
        )
    state = asyncio.run(master_state(ssh, seconds))
    if state != UP:
        raise TransportError(
            f"ssh logged in but no master answers at {path} ({state})",
            host=ssh.host,
            code=P.NO_MASTER,
            hint="does your ~/.ssh/config set ControlMaster no or ControlPath none for this host?",
        )
    say(f"the master for {ssh.host} is up: drover's calls ride it with no prompt ({path})")
    return state
