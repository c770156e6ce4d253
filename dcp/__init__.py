"""dcp: the DagBox Communication Protocol v1 for trio and asyncio programs."""

from __future__ import annotations

from ._beacon import find_broker as find_broker
from ._broker import Broker as Broker
from ._broker_core import BrokerStatistics as BrokerStatistics
from ._broker_core import ServiceStatistics as ServiceStatistics
from ._client import Client as Client
from ._core.approval import Approval as Approval
from ._core.approval import ApprovalRequest as ApprovalRequest
from ._core.pubsub import PubSubStatistics as PubSubStatistics
from ._core.pubsub_peers import PubSubOptions as PubSubOptions
from ._errors import AuthenticationFailed as AuthenticationFailed
from ._errors import BadProtocolFrame as BadProtocolFrame
from ._errors import BadTypeFrame as BadTypeFrame
from ._errors import DCPError as DCPError
from ._errors import LocalProtocolError as LocalProtocolError
from ._errors import MessageTooLarge as MessageTooLarge
from ._errors import MissingClientDelimiter as MissingClientDelimiter
from ._errors import MissingEnvelopeDelimiter as MissingEnvelopeDelimiter
from ._errors import MissingMetadataDelimiter as MissingMetadataDelimiter
from ._errors import MissingServiceName as MissingServiceName
from ._errors import NoWorkers as NoWorkers
from ._errors import ProtocolError as ProtocolError
from ._errors import RegistrationRefused as RegistrationRefused
from ._errors import RemoteError as RemoteError
from ._errors import RemoteProtocolError as RemoteProtocolError
from ._errors import RequestTimeout as RequestTimeout
from ._errors import StreamBroken as StreamBroken
from ._errors import TooFewFrames as TooFewFrames
from ._errors import TooManyFrames as TooManyFrames
from ._errors import UnexpectedFrames as UnexpectedFrames
from ._errors import UnknownMessageType as UnknownMessageType
from ._errors import UnsupportedVersion as UnsupportedVersion
from ._json import encode_json as to_json
from ._messages import ERROR_MARKER as ERROR_MARKER
from ._messages import Message as Message
from ._messages import MessageType as MessageType
from ._messages import Ping as Ping
from ._messages import Pong as Pong
from ._messages import Reconnect as Reconnect
from ._messages import Register as Register
from ._messages import Reply as Reply
from ._messages import Request as Request
from ._pubsub import PubSubMessage as PubSubMessage
from ._pubsub import SlowConsumer as SlowConsumer
from ._pubsub import Subscription as Subscription
from ._pubsub import SyncSubscription as SyncSubscription
from ._response import Response as Response
from ._results import Forward as Forward
from ._results import HandlerRequest as HandlerRequest
from ._security import CurveClient as CurveClient
from ._security import CurveServer as CurveServer
from ._services import Service as Service
from ._services import ServiceChange as ServiceChange
from ._services import ServiceInfo as ServiceInfo
from ._services import ServiceStats as ServiceStats
from ._services import ServiceSummary as ServiceSummary
from ._stats import ClientStatistics as ClientStatistics
from ._stats import StreamStatistics as StreamStatistics
from ._stats import WorkerStatistics as WorkerStatistics
from ._streams import Stream as Stream
from ._streams import SyncStream as SyncStream
from ._sync_client import SyncClient as SyncClient
from ._worker import Worker as Worker
from .wire.dcp1 import PROTOCOL as PROTOCOL
from .wire.dcp1 import parse as parse
from .wire.dcp1 import serialize as serialize

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
