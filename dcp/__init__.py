"""dcp: the DagBox Communication Protocol v1 for trio and asyncio programs.

Everything an application uses is here; the frames themselves are in :mod:`dcp.wire`.

``import dcp`` is cheap: each name is imported when first used, so a program (or the ``dcp``
command) loads only the parts it uses.
"""

from __future__ import annotations

import importlib
import sys
import typing

from dcp._version import __version__ as __version__

if typing.TYPE_CHECKING:
    from dcp._broker import Broker as Broker
    from dcp._client import Client as Client
    from dcp._client import SyncClient as SyncClient
    from dcp._client.pubsub import PubSubMessage as PubSubMessage
    from dcp._client.pubsub import SlowConsumer as SlowConsumer
    from dcp._client.pubsub import Subscription as Subscription
    from dcp._client.pubsub import SyncSubscription as SyncSubscription
    from dcp._client.services import ServiceChange as ServiceChange
    from dcp._client.services import ServiceInfo as ServiceInfo
    from dcp._client.services import ServiceStats as ServiceStats
    from dcp._client.services import ServiceSummary as ServiceSummary
    from dcp._client.streams import Stream as Stream
    from dcp._client.streams import SyncStream as SyncStream
    from dcp._core.broker.approval import Approval as Approval
    from dcp._core.broker.approval import ApprovalRequest as ApprovalRequest
    from dcp._core.broker.pubsub import PubSubStatistics as PubSubStatistics
    from dcp._core.broker.pubsub_peers import PubSubOptions as PubSubOptions
    from dcp._errors import AuthenticationFailed as AuthenticationFailed
    from dcp._errors import BindFailed as BindFailed
    from dcp._errors import DCPError as DCPError
    from dcp._errors import LocalProtocolError as LocalProtocolError
    from dcp._errors import NoWorkers as NoWorkers
    from dcp._errors import ProtocolError as ProtocolError
    from dcp._errors import RegistrationRefused as RegistrationRefused
    from dcp._errors import RemoteError as RemoteError
    from dcp._errors import RemoteProtocolError as RemoteProtocolError
    from dcp._errors import RequestTimeout as RequestTimeout
    from dcp._errors import StreamBroken as StreamBroken
    from dcp._io.beacon import find_broker as find_broker
    from dcp._io.beacon import find_brokers as find_brokers
    from dcp._io.security import CurveClient as CurveClient
    from dcp._io.security import CurveServer as CurveServer
    from dcp._models import Forward as Forward
    from dcp._models import HandlerRequest as HandlerRequest
    from dcp._models import Response as Response
    from dcp._models import json_reply as json_reply
    from dcp._stats import BrokerStatistics as BrokerStatistics
    from dcp._stats import ClientStatistics as ClientStatistics
    from dcp._stats import QueueStatistics as QueueStatistics
    from dcp._stats import StreamStatistics as StreamStatistics
    from dcp._stats import WorkerStatistics as WorkerStatistics
    from dcp._worker import Worker as Worker
    from dcp._worker.services import Service as Service

__all__ = [
    "Approval",
    "ApprovalRequest",
    "AuthenticationFailed",
    "BindFailed",
    "Broker",
    "BrokerStatistics",
    "Client",
    "ClientStatistics",
    "CurveClient",
    "CurveServer",
    "DCPError",
    "Forward",
    "HandlerRequest",
    "LocalProtocolError",
    "NoWorkers",
    "ProtocolError",
    "PubSubMessage",
    "PubSubOptions",
    "PubSubStatistics",
    "QueueStatistics",
    "RegistrationRefused",
    "RemoteError",
    "RemoteProtocolError",
    "RequestTimeout",
    "Response",
    "Service",
    "ServiceChange",
    "ServiceInfo",
    "ServiceStats",
    "ServiceSummary",
    "SlowConsumer",
    "Stream",
    "StreamBroken",
    "StreamStatistics",
    "Subscription",
    "SyncClient",
    "SyncStream",
    "SyncSubscription",
    "Worker",
    "WorkerStatistics",
    "find_broker",
    "find_brokers",
    "json_reply",
]

#: The module that defines each public name, imported when the name is first used.
_DEFINED_IN = {
    "Broker": "dcp._broker",
    "Client": "dcp._client",
    "SyncClient": "dcp._client",
    "PubSubMessage": "dcp._client.pubsub",
    "SlowConsumer": "dcp._client.pubsub",
    "Subscription": "dcp._client.pubsub",
    "SyncSubscription": "dcp._client.pubsub",
    "ServiceChange": "dcp._client.services",
    "ServiceInfo": "dcp._client.services",
    "ServiceStats": "dcp._client.services",
    "ServiceSummary": "dcp._client.services",
    "Stream": "dcp._client.streams",
    "SyncStream": "dcp._client.streams",
    "Approval": "dcp._core.broker.approval",
    "ApprovalRequest": "dcp._core.broker.approval",
    "PubSubStatistics": "dcp._core.broker.pubsub",
    "PubSubOptions": "dcp._core.broker.pubsub_peers",
    "AuthenticationFailed": "dcp._errors",
    "BindFailed": "dcp._errors",
    "DCPError": "dcp._errors",
    "LocalProtocolError": "dcp._errors",
    "NoWorkers": "dcp._errors",
    "ProtocolError": "dcp._errors",
    "RegistrationRefused": "dcp._errors",
    "RemoteError": "dcp._errors",
    "RemoteProtocolError": "dcp._errors",
    "RequestTimeout": "dcp._errors",
    "StreamBroken": "dcp._errors",
    "find_broker": "dcp._io.beacon",
    "find_brokers": "dcp._io.beacon",
    "CurveClient": "dcp._io.security",
    "CurveServer": "dcp._io.security",
    "Forward": "dcp._models",
    "HandlerRequest": "dcp._models",
    "Response": "dcp._models",
    "json_reply": "dcp._models",
    "BrokerStatistics": "dcp._stats",
    "ClientStatistics": "dcp._stats",
    "QueueStatistics": "dcp._stats",
    "StreamStatistics": "dcp._stats",
    "WorkerStatistics": "dcp._stats",
    "Worker": "dcp._worker",
    "Service": "dcp._worker.services",
}


if not typing.TYPE_CHECKING:  # type checkers see the imports above, and no other name

    def __getattr__(name: str) -> object:
        """Import a public name's module on first use, and show every public name loaded by
        then as ``dcp.Name`` (:func:`dcp._util.fixup_module_metadata`); ``dcp.wire`` too."""
        if name == "wire":  # imported with dcp when dcp imported all its parts
            return importlib.import_module("dcp.wire")
        if name not in _DEFINED_IN:
            raise AttributeError(f"module 'dcp' has no attribute {name!r}")
        value = getattr(importlib.import_module(_DEFINED_IN[name]), name)
        namespace = globals()
        loaded = {name: value}
        for public, module in _DEFINED_IN.items():
            if public not in namespace and hasattr(sys.modules.get(module), public):
                loaded[public] = getattr(sys.modules[module], public)
        from dcp._util import fixup_module_metadata

        fixup_module_metadata(__name__, {"__all__": list(loaded), **loaded})
        namespace.update(loaded)
        return value

    def __dir__() -> list[str]:
        """The module's names, and the public names not imported yet."""
        return sorted({*globals(), *__all__})
