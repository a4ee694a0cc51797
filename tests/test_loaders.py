"""Attachment loaders: MIME sniffed from the bytes, file names kept, clear errors."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from convoq import loaders
from convoq.errors import AttachmentError
from convoq.loaders import load_image, load_pdf
from convoq.messages import FilePart, ImagePart

BODY = random.Random(3).randbytes(4096)
PNG = b"\x89PNG\r\n\x1a\n" + BODY
JPEG = b"\xff\xd8\xff\xdb" + BODY
GIF87 = b"GIF87a" + BODY
GIF89 = b"GIF89a" + BODY
WEBP = b"RIFF\x24\x10\x00\x00WEBPVP8 " + BODY
PDF = b"%PDF-1.7\n" + BODY

IMAGES = [
    (PNG, "image/png"),
    (JPEG, "image/jpeg"),
    (GIF87, "image/gif"),
    (GIF89, "image/gif"),
    (WEBP, "image/webp"),
]


@pytest.mark.parametrize(("data", "mime"), IMAGES, ids=["png", "jpeg", "gif87a", "gif89a", "webp"])
def test_image_type_is_sniffed_from_the_bytes(tmp_path: Path, data: bytes, mime: str) -> None:
    path = tmp_path / "picture.bin"  # the extension says nothing
    path.write_bytes(data)
    part = load_image(path, provider_options={"detail": "low"})
    assert isinstance(part, ImagePart)
    assert (part.mime_type, part.data, part.provider_options) == (mime, data, {"detail": "low"})
    assert load_image(data).mime_type == mime


def test_pdf_keeps_its_file_name(tmp_path: Path) -> None:
    path = tmp_path / "annual report.pdf"
    path.write_bytes(PDF)
    for source in (path, str(path)):
        part = load_pdf(source)
        assert isinstance(part, FilePart)
        assert (part.mime_type, part.filename, part.data) == ("application/pdf", path.name, PDF)
    assert load_pdf(path, filename="renamed.pdf").filename == "renamed.pdf"


def test_bytes_input(tmp_path: Path) -> None:
    assert load_pdf(PDF, filename="given.pdf").filename == "given.pdf"
    assert load_pdf(PDF).filename is None
    assert load_pdf(bytearray(PDF)).data == PDF
    part = load_image(PNG, provider_options={"detail": "high"})
    assert (part.data, part.mime_type) == (PNG, "image/png")
    assert part.provider_options == {"detail": "high"}


def test_provider_options_are_copied() -> None:
    options = {"detail": "low"}
    part = load_image(PNG, provider_options=options)
    options["detail"] = "high"
    assert part.provider_options == {"detail": "low"}


@pytest.mark.parametrize("loader", [load_image, load_pdf])
def test_missing_file(tmp_path: Path, loader: object) -> None:
    missing = tmp_path / "nope.png"
    with pytest.raises(AttachmentError, match="no file at") as caught:
        loader(missing)  # type: ignore[operator]
    assert str(missing) in str(caught.value)
    assert not isinstance(caught.value, FileNotFoundError)


@pytest.mark.parametrize("loader", [load_image, load_pdf])
def test_directory(tmp_path: Path, loader: object) -> None:
    with pytest.raises(AttachmentError, match="is a directory"):
        loader(tmp_path)  # type: ignore[operator]


@pytest.mark.parametrize("loader", [load_image, load_pdf])
def test_empty_file_and_empty_bytes(tmp_path: Path, loader: object) -> None:
    empty = tmp_path / "empty.pdf"
    empty.touch()
    with pytest.raises(AttachmentError, match="is empty"):
        loader(empty)  # type: ignore[operator]
    with pytest.raises(AttachmentError, match="is empty"):
        loader(b"")  # type: ignore[operator]


def test_pdf_given_to_load_image(tmp_path: Path) -> None:
    path = tmp_path / "looks.png"
    path.write_bytes(PDF)
    with pytest.raises(AttachmentError, match=r"is a PDF, not a PNG, JPEG, GIF or WebP.*load_pdf"):
        load_image(path)


@pytest.mark.parametrize("data", [PNG, JPEG, WEBP], ids=["png", "jpeg", "webp"])
def test_image_given_to_load_pdf(data: bytes) -> None:
    with pytest.raises(AttachmentError, match=r"image, not a PDF.*load_image") as caught:
        load_pdf(data, filename="scan.pdf")
    assert "'scan.pdf'" in str(caught.value)


@pytest.mark.parametrize(
    "data",
    [b"hello world", b"RIFF\x24\x00\x00\x00WAVEfmt ", b"GIF88a....", b"\x89PNX\r\n", b"PK\x03\x04"],
    ids=["text", "wav", "gif88", "png-ish", "zip"],
)
def test_unknown_bytes_are_refused_by_both(data: bytes) -> None:
    with pytest.raises(AttachmentError, match=r"unknown type.*not a PNG, JPEG, GIF or WebP"):
        load_image(data)
    with pytest.raises(AttachmentError, match=r"unknown type.*not a PDF"):
        load_pdf(data)


def test_size_limit_is_configurable(tmp_path: Path) -> None:
    path = tmp_path / "doc.pdf"
    path.write_bytes(PDF[:100])
    assert load_pdf(path, max_bytes=100).data == PDF[:100]
    with pytest.raises(AttachmentError, match=r"over the 99 bytes limit.*max_bytes=") as caught:
        load_pdf(path, max_bytes=99)
    assert caught.value.details == {"size": 100, "max_bytes": 99}
    with pytest.raises(AttachmentError, match="over the 99 bytes limit"):
        load_image(PNG[:100], max_bytes=99)


def test_oversize_file_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "huge.png"
    with path.open("wb") as handle:  # sparse: 21 MiB on stat, nothing on disk
        handle.write(PNG[:16])
        handle.truncate(21 * 1024 * 1024)

    def no_open(*args: object, **kwargs: object) -> None:
        raise AssertionError("the file was opened")

    monkeypatch.setattr(loaders, "open", no_open, raising=False)
    with pytest.raises(AttachmentError, match=r"21\.0 MiB .*over the 20\.0 MiB .*limit"):
        load_image(path)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_max_bytes(bad: object) -> None:
    with pytest.raises(AttachmentError, match="max_bytes must be a positive int"):
        load_image(PNG, max_bytes=bad)  # type: ignore[arg-type]


def test_wrong_source_type() -> None:
    with pytest.raises(AttachmentError, match=r"expected a path .* or bytes, got int"):
        load_image(42)  # type: ignore[arg-type]


def test_pathlike_is_accepted(tmp_path: Path) -> None:
    class Where(os.PathLike[str]):
        def __fspath__(self) -> str:
            return str(tmp_path / "img")

    (tmp_path / "img").write_bytes(GIF89)
    assert load_image(Where()).mime_type == "image/gif"
