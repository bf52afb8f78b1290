"""The daemon's paths moved to drover/paths.py, the one home for drover's paths: this name stays for code written
against it (import drover.paths in new code)."""

from drover.paths import (
    CARRIED as CARRIED,
)
from drover.paths import (
    ENV_KEYS as ENV_KEYS,
)
from drover.paths import (
    ENV_PREFIXES as ENV_PREFIXES,
)
from drover.paths import (
    MAX_SOCKET_PATH as MAX_SOCKET_PATH,
)
from drover.paths import (
    SOCKET_NAME as SOCKET_NAME,
)
from drover.paths import (
    UMASK as UMASK,
)
from drover.paths import (
    Unsafe as Unsafe,
)
from drover.paths import (
    check_dir as check_dir,
)
from drover.paths import (
    current_umask as current_umask,
)
from drover.paths import (
    daemon_lock as daemon_lock,
)
from drover.paths import (
    daemon_log as daemon_log,
)
from drover.paths import (
    ensure_dir as ensure_dir,
)
from drover.paths import (
    environment as environment,
)
from drover.paths import (
    identity as identity,
)
from drover.paths import (
    key as key,
)
from drover.paths import (
    runtime_dir as runtime_dir,
)
from drover.paths import (
    socket_path as socket_path,
)
