"""The `[bots.NAME]` and `[webhook]` tables of the fleet file (fields of drover/fleet.py's Fleet).

Pure models, no I/O but reading a secret from the environment when `secret_env` names it: drover/fleet.py
imports this, so it imports nothing of drover's but the fleet's duration type (`"15s"`, `"5m"` or seconds)."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import urllib.parse

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

from drover.fleet_engines import Seconds

# Standard Webhooks secrets: `whsec_` and base64 of at least 24 random bytes (the spec asks 24 to 64).
SECRET_FORM = re.compile(r"^whsec_[A-Za-z0-9+/]{32,}={0,2}\Z")
# DROVER_ only: a persistent daemon serves only callers whose DROVER_* variables match its own (drover/paths.py), so a
# secret in any other variable could be one caller's and the daemon's another's.
ENV_NAME = re.compile(r"^DROVER_[A-Za-z0-9_]+\Z")
SECRET_HINT = (
    "a Standard Webhooks secret: whsec_ and base64 of 24+ random bytes "
    "(python3 -c 'import base64,os; print(\"whsec_\"+base64.b64encode(os.urandom(32)).decode())')"
)


class BotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    secret: str | None = Field(None, repr=False)
    secret_env: str | None = None
    timeout: Seconds = Field(15.0, gt=0, le=3600)
    retries: int = Field(2, ge=0, le=20)
    insecure: bool = False  # plain http to a non-loopback address: signed text in clear, only when the fleet says so

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        netloc = urllib.parse.urlsplit(value).netloc if re.match(r"^https?://", value) else ""
        if "@" in netloc:
            # Never echoed: what stands before the @ is a user name and often a password.
            raise ValueError(
                "a bot url must not hold credentials (user:password@): drover signs each request with the bot's "
                "secret; remove them from [bots] url"
            )
        if not re.match(r"^https?://[^\s/?#]+", value) or any(c.isspace() for c in value):
            raise ValueError(f"bot url {value!r} must be an http:// or https:// address with a host")
        return value

    @field_validator("secret")
    @classmethod
    def _form(cls, value: str | None) -> str | None:
        if value is not None and not SECRET_FORM.match(value):
            raise ValueError(f"a bot's secret must be {SECRET_HINT}")
        return value

    @field_validator("secret_env")
    @classmethod
    def _env(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.match(value):
            raise ValueError(
                f"secret_env {value!r} must name a DROVER_... environment variable (the persistent daemon shares the "
                "callers' DROVER_* variables, no others)"
            )
        return value

    @field_serializer("secret")
    def _hidden(self, value: str | None) -> str | None:
        # `drover fleet show` and every other dump of the fleet: the secret is never printed.
        return None if value is None else "whsec_(hidden)"

    @model_validator(mode="after")
    def _one_secret(self) -> BotConfig:
        if (self.secret is None) == (self.secret_env is None):
            raise ValueError('give a bot exactly one of secret = "whsec_..." or secret_env = "VAR"')
        return self

    @model_validator(mode="after")
    def _in_clear(self) -> BotConfig:
        url = urllib.parse.urlsplit(self.url)
        if url.scheme == "http" and not is_loopback(url.hostname or "") and not self.insecure:
            raise ValueError(
                f"bot url {self.url!r} is plain http to a non-loopback address (the signed text would go in clear): "
                "use https://, or set insecure = true for that bot"
            )
        return self

    def resolved_secret(self) -> str:
        """The secret, read from the environment when secret_env names it (so it stays out of the file).
        ValueError (one line, naming the variable) when it is missing or malformed."""
        if self.secret is not None:
            return self.secret
        value = os.environ.get(self.secret_env or "", "")
        if not SECRET_FORM.match(value):
            state = "is not set" if not value else "does not hold a whsec_... secret"
            raise ValueError(f"environment variable {self.secret_env} {state}: set it to {SECRET_HINT}")
        return value

    def fingerprint(self) -> str:
        """What a 410 is remembered against: a new url or secret is a changed fleet, and sends go again."""
        return hashlib.sha256(f"{self.url}\0{self.secret or '$' + str(self.secret_env)}".encode()).hexdigest()[:16]


def split_listen(listen: str) -> tuple[str, int]:
    """`ADDR:PORT` (`[v6]:PORT` for IPv6) -> (addr, port); ValueError in one line otherwise."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"[webhook] listen {listen!r} must be ADDR:PORT, e.g. 127.0.0.1:8789")
    return host.strip("[]"), int(port)


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


class WebhookConfig(BaseModel):
    """The reply listener (`drover webhook serve`): where it listens, whether it may face the network, how old a
    callback's timestamp may be, and the callback URL bots are told (default: from the listen address)."""

    model_config = ConfigDict(extra="forbid")
    listen: str = "127.0.0.1:8789"
    public: bool = False
    tolerance: Seconds = Field(300.0, gt=0, le=86400)
    callback_url: str | None = None

    @field_validator("callback_url")
    @classmethod
    def _callback_http(cls, value: str | None) -> str | None:
        if value is not None and (not re.match(r"^https?://[^\s/?#]+", value) or any(c.isspace() for c in value)):
            raise ValueError(f"[webhook] callback_url {value!r} must be an http:// or https:// address with a host")
        return value

    @model_validator(mode="after")
    def _loopback(self) -> WebhookConfig:
        check_listen(self.listen, self.public)
        return self

    def callback(self, bot: str, listen: str | None = None) -> str:
        if self.callback_url:
            return f"{self.callback_url}{'&' if '?' in self.callback_url else '?'}bot={bot}"
        host, port = split_listen(listen or self.listen)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/drover/reply?bot={bot}"


def check_listen(listen: str, public: bool) -> tuple[str, int]:
    """A listen address, refused when it is not loopback unless the fleet says `public = true`."""
    addr, port = split_listen(listen)
    if not is_loopback(addr) and not public:
        raise ValueError(
            f"[webhook] listen {listen!r} is not a loopback address: set public = true in [webhook] to expose the "
            "reply listener beyond this machine"
        )
    return addr, port
