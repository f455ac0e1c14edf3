"""`cellar certs issue` with a CA near its end: a certificate never outlives its CA, so one
asked for 365 days ends with the CA instead; the command said nothing of it, and an operator
learnt of it when the certificates all ended weeks later. It now says when they end, and why."""

from __future__ import annotations

import pathlib

import pytest
from cryptography import x509

from cellar.cli import main
from consensus.runtime.certs import CertificateAuthority


def test_a_certificate_cut_short_by_the_ca_is_said_to_be(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    authority = CertificateAuthority.create(days=20)
    authority.save(tmp_path)
    assert main(["certs", "issue", str(tmp_path), "--node", "gpu-1", "--days", "365"]) == 0
    issued = x509.load_pem_x509_certificate((tmp_path / "node-gpu-1.pem").read_bytes())
    ends = authority.certificate.not_valid_after_utc
    assert issued.not_valid_after_utc == ends
    error = capsys.readouterr().err
    assert f"{ends:%Y-%m-%d %H:%M} UTC" in error
    assert "not 365 days" in error


def test_a_certificate_within_the_ca_says_nothing_more(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "init", str(tmp_path), "--replicas", "1", "--days", "30"]) == 0
    assert "end with the CA" not in capsys.readouterr().err
