"""The wire protocol (docs/protocol.md): its version and the generated FlatBuffers classes.

`bitroll.wire` is the FlatBuffers Python code of schema/rollout.fbs (`flatc --python
--gen-object-api`). It is generated when the package is built, never when it is imported: by the
CMake target `bitroll_python` into <build>/python/bitroll/wire, and by `pip install ./python`
(python/setup.py) into the installed package. It is never committed.
"""

PROTOCOL_VERSION = 1  # kProtocolVersion in rollout/protocol.h
FILE_IDENTIFIER = b"BRL1"

_MISSING = (
    "bitroll: the generated FlatBuffers module bitroll.wire is missing beside {where}. It is "
    "generated when the package is built, never at import: build the CMake target bitroll_python "
    "(`cmake --build <build>`) and put <build>/python on PYTHONPATH, or install the package from "
    "a checkout with `pip install ./python` (both need flatc, Debian package "
    "flatbuffers-compiler).")

try:
    from .wire.ErrorCode import ErrorCode  # the first generated module
except ModuleNotFoundError as e:
    if e.name not in (__package__ + ".wire", __package__ + ".wire.ErrorCode"):
        raise
    import os
    raise ImportError(_MISSING.format(where=os.path.dirname(os.path.abspath(__file__))),
                      name=e.name) from None

from .wire.Abort import AbortT  # noqa: E402
from .wire.Ack import Ack, AckT  # noqa: E402
from .wire.Drain import DrainT  # noqa: E402
from .wire.Envelope import Envelope, EnvelopeT  # noqa: E402
from .wire.Error import Error  # noqa: E402
from .wire.FinishReason import FinishReason  # noqa: E402
from .wire.GroupDone import GroupDone  # noqa: E402
from .wire.Message import Message  # noqa: E402
from .wire.NcclWeights import NcclWeightsT  # noqa: E402
from .wire.Prompt import PromptT  # noqa: E402
from .wire.SamplingParams import SamplingParamsT  # noqa: E402
from .wire.Status import StatusT  # noqa: E402
from .wire.StatusReply import StatusReply  # noqa: E402
from .wire.SubmitRollouts import SubmitRolloutsT  # noqa: E402
from .wire.TensorFrame import TensorFrameT  # noqa: E402
from .wire.TokenChunk import TokenChunk  # noqa: E402
from .wire.ToolLimits import ToolLimitsT  # noqa: E402
from .wire.ToolSpec import ToolSpecT  # noqa: E402
from .wire.ToolTier import ToolTier  # noqa: E402
from .wire.Trajectory import Trajectory  # noqa: E402
from .wire.UpdateWeights import UpdateWeightsT  # noqa: E402

__all__ = ["PROTOCOL_VERSION", "FILE_IDENTIFIER", "AbortT", "Ack", "AckT", "DrainT", "Envelope",
           "EnvelopeT", "Error", "ErrorCode", "FinishReason", "GroupDone", "Message",
           "NcclWeightsT", "PromptT", "SamplingParamsT", "StatusReply", "StatusT",
           "SubmitRolloutsT", "TensorFrameT", "TokenChunk", "ToolLimitsT", "ToolSpecT", "ToolTier",
           "Trajectory", "UpdateWeightsT"]
