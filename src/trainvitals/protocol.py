"""Wire protocol constants shared by the agent and the server.

The full description of the frames lives in ``docs/protocol.md``. This module holds only the
names and limits both sides must agree on; it is plain Python so the agent stays light.
"""

from __future__ import annotations

from typing import Final

#: Version carried in every frame as ``"v"``. The server rejects versions it does not speak.
PROTOCOL_VERSION: Final = 1

INGEST_PATH: Final = "/api/v1/ingest"
LIVE_PATH: Final = "/api/v1/live"

#: Largest text frame the server accepts; the agent splits batches to stay under it.
MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
#: The agent never packs more points than this into one frame.
MAX_POINTS_PER_FRAME: Final = 50_000

# Agent -> server frame types.
HELLO: Final = "hello"
POINTS: Final = "points"
END: Final = "end"
#: No step for far longer than usual: carries every thread's stack. Numbered like points.
STALL: Final = "stall"
#: Where the first NaN/Inf came from (see ``trainvitals.agent.autopsy``). Numbered like points.
AUTOPSY: Final = "autopsy"
#: Sent when nothing else was sent for a while: the run is alive even if no step completes.
HEARTBEAT: Final = "heartbeat"
# Server -> agent frame types.
WELCOME: Final = "welcome"
ACK: Final = "ack"

# Websocket close codes the server uses for bad input (RFC 6455, section 7.4.1).
CLOSE_UNSUPPORTED_DATA: Final = 1003  # binary frame where text JSON was expected
CLOSE_INVALID_PAYLOAD: Final = 1007  # not JSON, or JSON that is not a valid frame
CLOSE_POLICY_VIOLATION: Final = 1008  # valid frame in the wrong place (points before hello, ...)
CLOSE_TOO_BIG: Final = 1009  # frame over MAX_FRAME_BYTES
CLOSE_TRY_AGAIN_LATER: Final = 1013  # a browser too slow to keep up with the live stream

#: How a run ended, as sent in the ``end`` frame.
END_COMPLETED: Final = "completed"
END_EXCEPTION: Final = "exception"
