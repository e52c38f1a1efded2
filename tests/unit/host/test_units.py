"""guestctl's one size parser."""

from __future__ import annotations

import pytest

from guestagent.host.units import LARGEST, OCI_UNLIMITED, parse_limit, parse_size

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("4096", 4096),
        ("4096B", 4096),
        ("1K", KIB),
        ("1k", KIB),
        ("64M", 64 * MIB),
        ("64m", 64 * MIB),
        ("64Mi", 64 * MIB),
        ("64mi", 64 * MIB),
        ("64MiB", 64 * MIB),
        ("512Mi", 512 * MIB),  # the issue's `limits --limit 512Mi`
        ("2G", 2 * GIB),
        ("2Gi", 2 * GIB),
        ("2GiB", 2 * GIB),
        ("1T", TIB),
        ("1Ti", TIB),
        ("1TiB", TIB),
        (" 8K ", 8 * KIB),
        ("1024000Mi", 1024000 * MIB),
        ("9223372036854775807", LARGEST),
        ("8388607TiB", 8388607 * TIB),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize(
    "text", ["", "M", "1.5G", "64X", "64 M", "64I", "64iB", "64MiBB", "0x10", "max"]
)
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=f"size {text!r} is not"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("-1", OCI_UNLIMITED),
        ("max", OCI_UNLIMITED),
        ("MAX", OCI_UNLIMITED),
        ("64Mi", 64 * MIB),
        ("0", 0),
    ],
)
def test_parse_limit(text: str, value: int) -> None:
    assert parse_limit(text) == value


@pytest.mark.parametrize("text", ["unlimited", "1.5G"])
def test_parse_limit_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not"):
        parse_limit(text)


@pytest.mark.parametrize("text", ["-2", "-5", "-1M", "-1G"])
def test_a_negative_limit_is_refused_saying_what_unlimited_is(text: str) -> None:
    with pytest.raises(ValueError, match="-1 or max means unlimited"):
        parse_limit(text)


@pytest.mark.parametrize("text", ["-1", "-5M"])
def test_a_negative_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=f"size {text!r} is negative"):
        parse_size(text)


@pytest.mark.parametrize(
    "text", ["9223372036854775808", "8388608T", "99999999999999999999999", "9" * 5000]
)
def test_a_size_over_int64_is_refused_naming_the_bound(text: str) -> None:
    with pytest.raises(ValueError, match=f"over the largest, {LARGEST} bytes"):
        parse_size(text)


@pytest.mark.parametrize("text", ["64MB", "1KB", "2GB", "1TB"])
def test_decimal_looking_suffixes_are_refused_naming_the_binary_one(text: str) -> None:
    """MB is 10^6 to SI and Kubernetes but 2^20 to Docker: neither guess is safe."""
    with pytest.raises(ValueError, match=f"ambiguous.*write {text[:-1]}iB"):
        parse_size(text)
