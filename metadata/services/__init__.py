"""The coordination services built on a MetadataStore, one small file each (the way
kazoo keeps its recipes apart): the cluster instance id, ledger ids, ledger metadata,
bookie registry, cookies, streams and cursors, under-replication, auditor election.
Each works under a root prefix (default "/streamlib") and stores the records of
metadata.schemas.

Layout under the root:
    instance                    ClusterInstance: the cluster's instance id, made once
    idgen                       the next free ledger id (8 bytes, big-endian), CAS'd
    ledgers/BBBBBBBBBBBBBBBB/NNNN   LedgerMetadata of ledger BBBB..NNNN (2 levels so no
                                child list grows past 10,000 names)
    ledger-secrets/BBBB../NNNN  the ledger's password, a PRIVATE node (only the writers'
                                identity reads it on ZooKeeper)
    bookies/available/ID        BookieInfo, ephemeral (the bookie's session)
    cookies/ID                  Cookie (records the cluster instance id it joined)
    security/principals         JSON principal -> roles map every bookie enforces
    streams/NAME                StreamMetadata; streams/NAME/cursors/SUB: CursorState
    underreplication/ledgers/N  UnderReplicatedLedger; .../locks/N ephemeral;
                                .../disabled present = auto-recovery disabled
    auditor/election            the auditor's election
    brokers/available/ID        BrokerInfo (with its load report), ephemeral
    brokers/owners/STREAM       the stream's lease: its owner's BrokerInfo, ephemeral
    brokers/leader              the brokers' load manager's election
    brokers/moves/STREAM        MoveRequest: the load manager moves the stream
    brokers/pins/STREAM         the broker id the stream is pinned to

Must never import: streamlib or bookie.
"""

from metadata.services._base import DEFAULT_ROOT
from metadata.services.auditor import AuditorElection
from metadata.services.bookies import BookieRegistry
from metadata.services.cluster import ClusterInstance
from metadata.services.cookies import CookieStore
from metadata.services.ledger_ids import LedgerIdGenerator
from metadata.services.ledgers import LedgerMetadataManager
from metadata.services.principals import PrincipalRoles
from metadata.services.streams import StreamRegistry
from metadata.services.underreplication import UnderReplicationManager

__all__ = [
    "DEFAULT_ROOT",
    "AuditorElection",
    "BookieRegistry",
    "ClusterInstance",
    "CookieStore",
    "LedgerIdGenerator",
    "LedgerMetadataManager",
    "PrincipalRoles",
    "StreamRegistry",
    "UnderReplicationManager",
]
