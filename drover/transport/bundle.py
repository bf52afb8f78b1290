"""The remote side as it travels: one compressed bundle of drover/remote's modules plus a short in-memory importer.

Over SSH the host runs `python3 -E -s -c BOOTSTRAP` and reads, on stdin, one length line and the compressed bundle,
then request lines.  The bundle is a JSON object {"loader": SOURCE, "modules": {NAME: SOURCE}}; the loader
installs a meta-path finder that serves the modules from memory as the package `drover_remote` (the way mitogen
ships its core), so nothing is written on the host.  Every answer carries the hash of the bundle the host
decompressed, which the client checks against its own.

The bootstrap is what sshd hands to the user's login shell, so it must mean the same in sh, bash, zsh, fish and
csh/tcsh: one line, single-quoted, with no single quote, backslash, `!` or newline inside (tcsh expands `!` and
rejects newlines even in single quotes; fish treats backslashes in them as escapes).  It must also parse under an
old interpreter long enough to say "too old" with exit 97.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import zlib
from pathlib import Path

from drover.remote import protocol

REMOTE_DIR = Path(protocol.__file__).resolve().parent
PACKAGE = "drover_remote"

# `-E -s` and dropping the current directory from sys.path is what `-I` does, spelt so that an interpreter too
# old to know `-I` (2.7, 3.3) still starts and answers "too old" instead of a usage error.
BOOTSTRAP = (
    'import sys;sys.path=[p for p in sys.path if p not in ("",".")];'
    f"sys.version_info<{protocol.MIN_PYTHON!r} and sys.exit({protocol.EXIT_TOO_OLD});"
    "import zlib,json;s=sys.stdin.buffer;n=int(s.readline());b=zlib.decompress(s.read(n));"
    'd=json.loads(b.decode());exec(d["loader"],{"__name__":"drover_boot","BUNDLE":b,"MODULES":d["modules"]})'
)

# Runs on the host with BUNDLE (the decompressed bytes) and MODULES in its globals.  Python 3.6+.
LOADER = '''
import hashlib, importlib.util, sys

PACKAGE = "drover_remote"


class BundleImporter:
    """Serves drover_remote and its modules from MODULES: no file is read or written."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == PACKAGE:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        head, _, name = fullname.rpartition(".")
        if head == PACKAGE and name in MODULES:
            return importlib.util.spec_from_loader(fullname, self, is_package=False)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__.rpartition(".")[2] if module.__name__ != PACKAGE else "__init__"
        source = MODULES[name]
        exec(compile(source, "<drover bundle>/%s.py" % name, "exec"), module.__dict__)


sys.meta_path.insert(0, BundleImporter())
package = __import__(PACKAGE)
package.BUNDLE = hashlib.sha256(BUNDLE).hexdigest()[:16]
from drover_remote import main as _main
sys.exit(_main.main())
'''


def check_bootstrap(text: str) -> None:
    """The bootstrap's shell-safety rules, asserted where it is built (and pinned by a test)."""
    for bad in ("'", "\\", "!", "\n", "\r"):
        if bad in text:
            raise AssertionError(f"the bootstrap must not contain {bad!r}: some login shell would read it differently")


check_bootstrap(BOOTSTRAP)


@functools.lru_cache(maxsize=1)
def build() -> tuple[bytes, str]:
    """(the compressed bundle, its hash as the host will report it).  Compressing ~380 KB at level 9 costs a cold
    command ~40 ms, so the result is kept in the drover home under its hash, and read back only when it
    decompresses to exactly this bundle."""
    modules = {path.stem: path.read_text(encoding="utf-8") for path in sorted(REMOTE_DIR.glob("*.py"))}
    raw = json.dumps({"loader": LOADER, "modules": modules}, sort_keys=True).encode("utf-8")
    digest = hashlib.sha256(raw).hexdigest()[:16]
    home = _home()
    path = os.path.join(home, f"{CACHE_PREFIX}{digest}.z")
    blob = _cached(path, raw)
    if blob is None:
        blob = zlib.compress(raw, 9)
        _save(home, path, blob)
    return blob, digest


CACHE_PREFIX = "bundle-"


def _home() -> str:
    from drover import paths  # here: the helper's own modules never need it

    return paths.home()


def _cached(path: str, raw: bytes) -> bytes | None:
    """The kept bundle when it is ours, nobody else could have written it, and it is exactly `raw` compressed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o022 or st.st_size > len(raw) + 1024:
            return None
        blob = os.read(fd, st.st_size + 1)
        return blob if zlib.decompress(blob) == raw else None
    except (OSError, zlib.error):
        return None
    finally:
        os.close(fd)


def _save(home: str, path: str, blob: bytes) -> None:
    """Best effort, atomically (a concurrent reader sees the old file or the new one), and only into a home that
    exists (making it is the truth file's business: drover/truth_home.py); an older drover's bundle goes (one is
    kept, not one per upgrade)."""
    if not os.path.isdir(home):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
        for entry in os.scandir(home):
            if entry.name.startswith(CACHE_PREFIX) and entry.name.endswith(".z") and entry.path != path:
                os.unlink(entry.path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def preamble() -> bytes:
    """What goes on stdin before the first request: the bundle's length line and the bundle."""
    blob, _hash = build()
    return str(len(blob)).encode() + b"\n" + blob


def bundle_hash() -> str:
    return build()[1]


# A leading ~/ is expanded by every one of those shells when it is not quoted, which it is not here.
SAFE_WORD = re.compile(r"^(~/)?[A-Za-z0-9_./+-]+$")


def command(python: str) -> str:
    """The one-line command sshd hands to the login shell.  `python` must need no quoting in any shell."""
    if not SAFE_WORD.match(python):
        raise ValueError(
            f"python = {python!r}: only letters, digits and _ . / + - (and a leading ~/) are allowed in the interpreter's path"
        )
    return f"exec {python} -E -s -c '{BOOTSTRAP}'"
