"""The learner-to-syncer protocol across sites: gRPC (``grpcio``), one room beside the syncer.

What crosses the WAN between a site's learner and the syncer service is this protocol alone: no Ray at the site,
no Ray cluster spanning sites (Ray stays inside the syncer's host, where the service keeps its checkpointed actor).

* :mod:`.frames`: the messages as bytes (a small strict-JSON header, then the tensors' raw bytes; no pickle).
* :mod:`.gateway`: the server, in the ``diloco syncer`` process, that forwards each call to the syncer actor(s).
* :mod:`.client`: a learner's :class:`~diloco.decoupled.learner.Channel` over it (deadlines, retries, the token).
* :mod:`.replicate`: the active syncer's state copied to a standby (``diloco syncer --standby-of``) before a
  learner is answered, and the epoch that fences a former active.
* :mod:`.probe`: is a ``syncer=NAME@HOST:PORT`` worth starting for (answers, the name, the token), before any
  file is written.

Every call carries the service's token (gRPC metadata ``diloco-token``); a wrong or missing one is refused
(``UNAUTHENTICATED``) with a message saying so. Imports nothing heavy: ``grpc`` is imported where it is used.
"""

import os

# gRPC's fork handlers off (unless the user set them): with them on, a process forked while another thread is inside
# gRPC (the service's gateway serving learners while the service starts Ray, which forks its GCS, raylet and agents)
# can abort before it runs its program. gRPC logs "Other threads are currently calling into gRPC, skipping fork()
# handlers"; the child ends with SIGABRT (5 of 200 `subprocess.run` children with a pre-exec function, beside 3
# threads calling a server), and Ray, whose GCS never writes its port, times out. Nothing here forks a process that
# goes on using gRPC: every child runs a new program. Read when grpc initializes, so set before it is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

#: The environment variable a site's learner reads the service's token from (the printed command sets it).
TOKEN_ENV = "DILOCO_SYNCER_TOKEN"
#: The port ``diloco syncer`` serves learners on unless told otherwise (the one a firewall must open).
DEFAULT_PORT = 7171
#: gRPC's service name: each call is ``/diloco.Syncer/<Method>``.
SERVICE = "diloco.Syncer"
METHODS = ("Ping", "Hello", "Heartbeat", "Join", "Report", "WaitReply", "Leave", "Hold", "Status", "Replicate")
#: gRPC metadata: the syncer's epoch on every answer (trailing), the newest epoch a learner has seen on every call
#: (:mod:`.replicate`: a standby that took over serves epoch + 1; an older one is ignored, and refuses).
EPOCH_KEY = "diloco-epoch"
GRPC_MISSING = "a site's learner talks to the syncer over gRPC: pip install -e .[site] (or grpcio>=1.60)"

__all__ = ["DEFAULT_PORT", "EPOCH_KEY", "GRPC_MISSING", "METHODS", "SERVICE", "TOKEN_ENV"]
