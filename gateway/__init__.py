"""The HTTP gateway: ``sfaas gateway --listen HOST:PORT --app module:app``.

It speaks HTTP/JSON to the outside and Kafka to the cluster through one
:class:`sfaas.client.Client`; it is a client, not part of the runtime (it imports ``sfaas``
only, never ``worker`` or ``coordinator``). Its rooms:

* :mod:`gateway.app`      routes, auth, limits and the mapping of SDK errors to statuses;
* :mod:`gateway.values`   JSON bodies to arguments, msgpack values to JSON;
* :mod:`gateway.schemas`  the JSON Schemas of arguments and results, from the signatures;
* :mod:`gateway.checks`   a request's arguments held to those schemas;
* :mod:`gateway.openapi`  ``/openapi.json``: every operation, status and schema;
* :mod:`gateway.metrics`  ``/metrics``;
* :mod:`gateway.settings` ``SFAAS_GATEWAY_*`` settings and :data:`MAX_BODY`;
* :mod:`gateway.service`  the process: the client, then uvicorn.
"""

from __future__ import annotations

from gateway.settings import MAX_BODY, GatewaySettings

__all__ = ["GatewaySettings", "MAX_BODY"]
