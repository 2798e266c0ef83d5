"""A real ZooKeeper (Debian's package) that speaks TLS on a secure client port.

Debian's zookeeper 3.8 has what TLS needs: NettyServerCnxnFactory (the NIO factory
cannot do TLS) and PEM key and trust stores (ssl.keyStore.type=PEM, ZooKeeper >= 3.6),
so the certificates of streamlib.security.make_certs serve as they are. One gap: zookeeper.jar's
manifest Class-Path names netty-handler but not netty-codec, which the TLS pipeline
loads (NoClassDefFoundError io/netty/handler/codec/ByteToMessageDecoder on the first
TLS connection), hence the extra jars on the class path.

The plaintext clientPort stays open: it answers the readiness probe, and it is the
wrong port a TLS client must be refused on.
"""

from __future__ import annotations

from pathlib import Path

from streamlib.security import CertFiles
from tests.conftest import ZooKeeperServer, free_port

JAVA_LIBS = Path("/usr/share/java")
# Not in zookeeper.jar's manifest, needed by Netty's TLS handler; slf4j-simple gives
# the server a log (zookeeper.log) to read when a handshake fails.
EXTRA_JARS = ("netty-codec.jar", "slf4j-simple.jar")


class TlsZooKeeperServer(ZooKeeperServer):
    def __init__(self, workdir: Path, certs: CertFiles) -> None:
        super().__init__(workdir)  # self.port: the plaintext port
        self.certs = certs
        self.secure_port = free_port()

    @property
    def secure_hosts(self) -> str:
        return f"localhost:{self.secure_port}"  # the name the test certificate gives

    def config_lines(self) -> list[str]:
        # A PEM key store is one file holding the private key and its certificate.
        keystore = self.workdir / "server-keystore.pem"
        keystore.write_bytes(
            self.certs.server_key.read_bytes() + self.certs.server_cert.read_bytes()
        )
        keystore.chmod(0o600)
        return [
            *super().config_lines(),
            f"secureClientPort={self.secure_port}",
            "secureClientPortAddress=127.0.0.1",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={self.certs.ca}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=need",  # mutual TLS: a client without a certificate is refused
        ]

    def classpath(self) -> list[str]:
        return [*super().classpath(), *(str(JAVA_LIBS / jar) for jar in EXTRA_JARS)]
