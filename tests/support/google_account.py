"""A Google service account for tests: an RSA key pair made per run, its key file
written as Google writes one (``token_uri`` pointing at a fake upstream's token
endpoint), and its public key as the fake upstream takes it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

EMAIL = "llm-proxy@test-project.iam.gserviceaccount.com"
PROJECT = "test-project"


@dataclass(frozen=True)
class ServiceAccount:
    email: str
    private_pem: str
    public_pem: str

    @property
    def accounts(self) -> tuple[tuple[str, str], ...]:
        """As ``FakeUpstreamConfig.google_service_accounts`` takes it."""
        return ((self.email, self.public_pem),)

    @property
    def key_line(self) -> str:
        """A line of the private key's base64: what must never be logged."""
        return self.private_pem.splitlines()[5]

    def write(self, path: Path, token_uri: str) -> Path:
        info = {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "0123456789abcdef",
            "private_key": self.private_pem,
            "client_email": self.email,
            "client_id": "100000000000000000001",
            "token_uri": token_uri,
        }
        path.write_bytes(orjson.dumps(info))
        path.chmod(0o600)
        return path


def service_account(email: str = EMAIL) -> ServiceAccount:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return ServiceAccount(email, private, public)
