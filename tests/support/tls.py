"""A test certificate authority, made with the openssl command: a server certificate for
127.0.0.1 and a client certificate (for mTLS), both signed by it. Nothing is trusted
outside the test that makes them."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CertificateAuthority", "openssl_available"]


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class CertificateAuthority:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, directory: Path) -> CertificateAuthority:
        d = directory
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", "/CN=llm-proxy test CA", "-keyout", str(d / "ca.key"),
                 "-out", str(d / "ca.pem"))  # fmt: skip
        for name, extension in (
            ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
            ("client", "extendedKeyUsage=clientAuth"),
        ):
            (d / f"{name}.ext").write_text(extension + "\n")
            _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                     "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
            _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                     "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                     "-extfile", str(d / f"{name}.ext"),
                     "-out", str(d / f"{name}.pem"))  # fmt: skip
        return cls(
            d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key"
        )

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca)
        return context
