"""dcp: the DagBox Communication Protocol v1 for trio and asyncio programs.

Everything an application uses is here; the frames themselves are in :mod:`dcp.wire`.
"""

from __future__ import annotations

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
from dcp._util import fixup_module_metadata
from dcp._version import __version__ as __version__
from dcp._worker import Worker as Worker
from dcp._worker.services import Service as Service

__all__ = [
    "Approval",
    "ApprovalRequest",
    "AuthenticationFailed",
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
    "json_reply",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
