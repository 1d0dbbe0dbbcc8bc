"""bitroll: the Python client of the bitroll rollout service (docs/protocol.md).

    import bitroll
    with bitroll.Client("tcp://127.0.0.1:5555") as client:
        group = client.submit(["Once upon a time"], n=4, params={"temperature": 1.0}, seed=7)
        for traj in group:                  # bitroll.Trajectory, as each one finishes
            print(traj.ids, traj.logprobs)  # int32 token ids, float32 log-probs (exact bits)

Modules: client (Client, Group: what is sent), messages (Trajectory, TokenChunk: what is
received), protocol (the version and the generated classes of schema/rollout.fbs), errors
(BitrollError), model_files (checkpoints as named tensors), nccl (weights over NCCL; imported on
demand). The FlatBuffers code (bitroll.wire) is generated when the package is built.
"""

from .client import Client, Group, submit_rollouts
from .errors import BitrollError
from .messages import TokenChunk, Trajectory
from .protocol import PROTOCOL_VERSION

__version__ = "0.1.0"
__all__ = ["BitrollError", "Client", "Group", "PROTOCOL_VERSION", "TokenChunk", "Trajectory",
           "submit_rollouts"]
