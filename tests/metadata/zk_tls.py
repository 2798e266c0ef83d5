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

import shutil
import subprocess
import time
from pathlib import Path

from streamlib.security import CertFiles
from tests.conftest import ZOOKEEPER_JAR, ZOOKEEPER_START_TIMEOUT_S, four_letter, free_port

JAVA_LIBS = Path("/usr/share/java")
# Not in zookeeper.jar's manifest, needed by Netty's TLS handler; slf4j-simple gives
# the server a log (zookeeper.log) to read when a handshake fails.
EXTRA_JARS = ("netty-codec.jar", "slf4j-simple.jar")


class TlsZooKeeperServer:
    def __init__(self, workdir: Path, certs: CertFiles) -> None:
        self.workdir = workdir
        self.certs = certs
        self.port = free_port()  # plaintext
        self.secure_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_hosts(self) -> str:
        return f"localhost:{self.secure_port}"  # the name the test certificate gives

    def config(self) -> str:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        # A PEM key store is one file holding the private key and its certificate.
        keystore = self.workdir / "server-keystore.pem"
        keystore.write_bytes(
            self.certs.server_key.read_bytes() + self.certs.server_cert.read_bytes()
        )
        keystore.chmod(0o600)
        return "\n".join(
            [
                "tickTime=500",
                f"dataDir={data}",
                f"clientPort={self.port}",
                "clientPortAddress=127.0.0.1",
                f"secureClientPort={self.secure_port}",
                "secureClientPortAddress=127.0.0.1",
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                f"ssl.keyStore.location={keystore}",
                "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={self.certs.ca}",
                "ssl.trustStore.type=PEM",
                "ssl.clientAuth=need",  # mutual TLS: a client without a certificate is refused
                "admin.enableServer=false",
                "4lw.commands.whitelist=*",
                "maxSessionTimeout=60000",
                "forceSync=no",
                "",
            ]
        )

    def start(self) -> None:
        config = self.workdir / "zoo.cfg"
        config.write_text(self.config())
        java = shutil.which("java")
        assert java, "java is missing: run ./dev setup"
        classpath = [str(ZOOKEEPER_JAR), *(str(JAVA_LIBS / jar) for jar in EXTRA_JARS)]
        log = (self.workdir / "zookeeper.log").open("wb")
        self.process = subprocess.Popen(
            [
                java,
                "-Xmx256m",
                "-cp",
                ":".join(classpath),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                str(config),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        deadline = time.monotonic() + ZOOKEEPER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited: see {self.workdir / 'zookeeper.log'}")
            try:
                if b"Mode: standalone" in four_letter(self.port, b"srvr"):
                    return
            except OSError:
                pass
            time.sleep(0.05)  # bounded wait for the server socket; nothing to block on
        self.stop()
        raise RuntimeError(f"ZooKeeper did not start in {ZOOKEEPER_START_TIMEOUT_S}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
