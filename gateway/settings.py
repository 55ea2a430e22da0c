"""The gateway's own settings: defaults < ``SFAAS_GATEWAY_*`` environment < flags.

The cluster side (Kafka, namespace, log level) comes from :class:`sfaas.runtime.settings.
Settings` like every process's; these are the HTTP side. The token is a credential: it is
never in a repr, a log line or an error message.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sfaas.errors import ConfigError
from sfaas.runtime.settings import is_loopback

__all__ = ["GatewaySettings", "MAX_BODY", "MIN_TOKEN", "DEFAULT_MAX_IN_FLIGHT"]

#: Largest request body the gateway reads (bytes); a larger one gets 413. With
#: ``max_in_flight`` it bounds the memory request bodies can take.
MAX_BODY = 1 << 20
#: Requests a gateway works on at once by default (``max_in_flight``); one more gets 429.
DEFAULT_MAX_IN_FLIGHT = 1000
#: Shortest bearer token accepted: a short one can be guessed.
MIN_TOKEN = 16


@dataclass
class GatewaySettings:
    """Configuration of one ``sfaas gateway`` process (``SFAAS_GATEWAY_<NAME>``)."""

    #: ``host:port`` to serve HTTP on; beyond loopback it needs ``token``.
    listen: str = "127.0.0.1:8080"
    #: Bearer token every ``/v1`` request and ``/openapi.json`` must carry; empty: no auth
    #: (refused unless ``listen`` is a loopback address).
    token: str = field(default="", repr=False)
    #: Requests the gateway works on at once; one more gets 429 at once (never queued).
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    #: Seconds a request waits for the cluster's reply before 504.
    timeout: float = 30.0

    @classmethod
    def load(cls, overrides: dict[str, Any] | None = None,
             env: Mapping[str, str] | None = None) -> GatewaySettings:
        """Defaults, then ``SFAAS_GATEWAY_*`` from ``env`` (default ``os.environ``), then
        ``overrides`` (None values skipped)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, f in fields.items():
            raw = env.get(f"SFAAS_GATEWAY_{name.upper()}")
            if raw:
                values[name] = _convert(f, raw, f"SFAAS_GATEWAY_{name.upper()}")
        for name, value in (overrides or {}).items():
            if value is None:
                continue
            if name not in fields:
                raise ConfigError(f"unknown gateway setting {name!r}")
            values[name] = _convert(fields[name], value, name) if isinstance(value, str) \
                else value
        s = cls(**values)
        s.validate()
        return s

    def address(self) -> tuple[str, int]:
        """``(host, port)`` of :attr:`listen`."""
        host, sep, port = self.listen.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5 \
                or int(port) > 65535:
            raise ConfigError(f"gateway listen address must be host:port (port 0-65535), "
                              f"got {self.listen!r:.80}")
        return host, int(port)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first invalid value (the token's value is
        never named)."""
        host, _ = self.address()
        if type(self.max_in_flight) is not int or not 1 <= self.max_in_flight <= 100_000:
            raise ConfigError("gateway max_in_flight (SFAAS_GATEWAY_MAX_IN_FLIGHT) must be an "
                              f"int from 1 to 100000, got {self.max_in_flight!r:.40}")
        if type(self.timeout) not in (int, float) or not math.isfinite(self.timeout) \
                or not 0 < self.timeout <= 3600:
            raise ConfigError("gateway timeout (SFAAS_GATEWAY_TIMEOUT) must be a number of "
                              f"seconds > 0 and <= 3600, got {self.timeout!r:.40}")
        if self.token and (len(self.token) < MIN_TOKEN or not self.token.isascii()
                           or not self.token.isprintable() or " " in self.token):
            raise ConfigError(f"the gateway token (SFAAS_GATEWAY_TOKEN) must be at least "
                              f"{MIN_TOKEN} printable ASCII characters without blanks "
                              f"(it has {len(self.token)} characters)")
        if not self.token and not is_loopback(host):
            raise ConfigError(
                f"refusing to serve HTTP on {host} without a bearer token: set "
                "SFAAS_GATEWAY_TOKEN to a long random value (clients send it as "
                "'Authorization: Bearer <token>'), or listen on a loopback address only")


def _convert(f: dataclasses.Field[Any], raw: str, name: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "str")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        wanted = "an integer" if kind == "int" else "a number"
        raise ConfigError(f"{name} must be {wanted}, got {raw!r:.60}") from None
    return raw
