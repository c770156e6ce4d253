"""dcp: the DagBox Communication Protocol v1 for trio and asyncio programs."""

from __future__ import annotations

from dcp._broker.broker import Broker as Broker
from dcp._client.client import Client as Client
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
from dcp._client.sync_client import SyncClient as SyncClient
from dcp._core.broker.approval import Approval as Approval
from dcp._core.broker.approval import ApprovalRequest as ApprovalRequest
from dcp._core.broker.core import BrokerStatistics as BrokerStatistics
from dcp._core.broker.core import ServiceStatistics as ServiceStatistics
from dcp._core.broker.pubsub import PubSubStatistics as PubSubStatistics
from dcp._core.broker.pubsub_peers import PubSubOptions as PubSubOptions
from dcp._errors import AuthenticationFailed as AuthenticationFailed
from dcp._errors import BadProtocolFrame as BadProtocolFrame
from dcp._errors import BadTypeFrame as BadTypeFrame
from dcp._errors import DCPError as DCPError
from dcp._errors import LocalProtocolError as LocalProtocolError
from dcp._errors import MessageTooLarge as MessageTooLarge
from dcp._errors import MissingClientDelimiter as MissingClientDelimiter
from dcp._errors import MissingEnvelopeDelimiter as MissingEnvelopeDelimiter
from dcp._errors import MissingMetadataDelimiter as MissingMetadataDelimiter
from dcp._errors import MissingServiceName as MissingServiceName
from dcp._errors import NoWorkers as NoWorkers
from dcp._errors import ProtocolError as ProtocolError
from dcp._errors import RegistrationRefused as RegistrationRefused
from dcp._errors import RemoteError as RemoteError
from dcp._errors import RemoteProtocolError as RemoteProtocolError
from dcp._errors import RequestTimeout as RequestTimeout
from dcp._errors import StreamBroken as StreamBroken
from dcp._errors import TooFewFrames as TooFewFrames
from dcp._errors import TooManyFrames as TooManyFrames
from dcp._errors import UnexpectedFrames as UnexpectedFrames
from dcp._errors import UnknownMessageType as UnknownMessageType
from dcp._errors import UnsupportedVersion as UnsupportedVersion
from dcp._io.beacon import find_broker as find_broker
from dcp._io.security import CurveClient as CurveClient
from dcp._io.security import CurveServer as CurveServer
from dcp._json import encode_json as to_json
from dcp._models import Forward as Forward
from dcp._models import HandlerRequest as HandlerRequest
from dcp._models import Response as Response
from dcp._stats import ClientStatistics as ClientStatistics
from dcp._stats import StreamStatistics as StreamStatistics
from dcp._stats import WorkerStatistics as WorkerStatistics
from dcp._worker.services import Service as Service
from dcp._worker.worker import Worker as Worker
from dcp.wire.dcp1 import PROTOCOL as PROTOCOL
from dcp.wire.dcp1 import parse as parse
from dcp.wire.dcp1 import serialize as serialize
from dcp.wire.messages import ERROR_MARKER as ERROR_MARKER
from dcp.wire.messages import Message as Message
from dcp.wire.messages import MessageType as MessageType
from dcp.wire.messages import Ping as Ping
from dcp.wire.messages import Pong as Pong
from dcp.wire.messages import Reconnect as Reconnect
from dcp.wire.messages import Register as Register
from dcp.wire.messages import Reply as Reply
from dcp.wire.messages import Request as Request

__version__ = "0.1.0.dev0"

__all__ = [
    "ERROR_MARKER",
    "PROTOCOL",
    "Approval",
    "ApprovalRequest",
    "AuthenticationFailed",
    "BadProtocolFrame",
    "BadTypeFrame",
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
    "Message",
    "MessageTooLarge",
    "MessageType",
    "MissingClientDelimiter",
    "MissingEnvelopeDelimiter",
    "MissingMetadataDelimiter",
    "MissingServiceName",
    "NoWorkers",
    "Ping",
    "Pong",
    "ProtocolError",
    "PubSubMessage",
    "PubSubOptions",
    "PubSubStatistics",
    "Reconnect",
    "Register",
    "RegistrationRefused",
    "RemoteError",
    "RemoteProtocolError",
    "Reply",
    "Request",
    "RequestTimeout",
    "Response",
    "Service",
    "ServiceChange",
    "ServiceInfo",
    "ServiceStatistics",
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
    "TooFewFrames",
    "TooManyFrames",
    "UnexpectedFrames",
    "UnknownMessageType",
    "UnsupportedVersion",
    "Worker",
    "WorkerStatistics",
    "find_broker",
    "parse",
    "serialize",
    "to_json",
]
