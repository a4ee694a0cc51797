"""Load images and PDFs as message parts: bytes, a MIME type sniffed from the bytes, a limit.

The MIME type comes from the file's magic bytes, never from its extension, so a PDF renamed
``.png`` is refused by :func:`load_image` instead of reaching a model as a broken image.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from convoq import defaults
from convoq.errors import AttachmentError
from convoq.messages import FilePart, ImagePart

DEFAULT_MAX_BYTES = defaults.MAX_ATTACHMENT_BYTES

PathOrBytes = str | os.PathLike[str] | bytes

IMAGE_MIME_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
PDF_MIME_TYPE = "application/pdf"

_KIND = {
    "image/png": "a PNG image",
    "image/jpeg": "a JPEG image",
    "image/gif": "a GIF image",
    "image/webp": "a WebP image",
    PDF_MIME_TYPE: "a PDF",
}


def sniff_mime_type(data: bytes) -> str | None:
    """The MIME type told by the leading magic bytes, or ``None`` when unknown."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return PDF_MIME_TYPE
    return None


def load_image(
    path_or_bytes: PathOrBytes,
    *,
    filename: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    provider_options: dict[str, Any] | None = None,
) -> ImagePart:
    """Read a PNG, JPEG, GIF or WebP image into an :class:`ImagePart`.

    Args:
        path_or_bytes: a path to the image or its bytes.
        filename: the name used in error messages when bytes are given.
        max_bytes: the largest image accepted.
        provider_options: passed through to the model (e.g. ``{"detail": "low"}``).

    Raises:
        AttachmentError: the file is missing, a directory, empty, over ``max_bytes`` or
            not one of the image types above.
    """
    data, name, _ = _read_source(path_or_bytes, filename, max_bytes)
    mime = sniff_mime_type(data)
    if mime not in IMAGE_MIME_TYPES:
        hint = "; use load_pdf for PDFs" if mime == PDF_MIME_TYPE else ""
        raise AttachmentError(
            f"{name} is {_describe(data, mime)}, not a PNG, JPEG, GIF or WebP image{hint}",
            filename=name,
            mime_type=mime,
        )
    assert mime is not None  # narrowed by the membership test above
    return ImagePart(data=data, mime_type=mime, provider_options=dict(provider_options or {}))


def load_pdf(
    path_or_bytes: PathOrBytes,
    *,
    filename: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    provider_options: dict[str, Any] | None = None,
) -> FilePart:
    """Read a PDF into a :class:`FilePart` that keeps its file name.

    Args:
        path_or_bytes: a path to the PDF or its bytes.
        filename: the file name to keep; defaults to the path's base name (``None`` for
            bytes given without one).
        max_bytes: the largest file accepted.
        provider_options: passed through to the model.

    Raises:
        AttachmentError: the file is missing, a directory, empty, over ``max_bytes`` or
            not a PDF.
    """
    data, name, base_name = _read_source(path_or_bytes, filename, max_bytes)
    mime = sniff_mime_type(data)
    if mime != PDF_MIME_TYPE:
        hint = "; use load_image for images" if mime in IMAGE_MIME_TYPES else ""
        raise AttachmentError(
            f"{name} is {_describe(data, mime)}, not a PDF (it should start with %PDF-){hint}",
            filename=name,
            mime_type=mime,
        )
    return FilePart(
        data=data,
        mime_type=PDF_MIME_TYPE,
        filename=filename if filename is not None else base_name,
        provider_options=dict(provider_options or {}),
    )


def _read_source(
    source: PathOrBytes, filename: str | None, max_bytes: int
) -> tuple[bytes, str, str | None]:
    """Return (bytes, a name for messages, the file's base name), within the size limit."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise AttachmentError(f"max_bytes must be a positive int, not {max_bytes!r}")
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        name = repr(filename) if filename else "the given bytes"
        _check_size(len(data), max_bytes, name)
        return data, name, None
    if not isinstance(source, str | os.PathLike):
        raise AttachmentError(
            f"expected a path (str or os.PathLike) or bytes, got {type(source).__name__}"
        )
    path = os.fspath(source)
    return _read_file(path, max_bytes), repr(path), os.path.basename(path)


def _read_file(path: str, max_bytes: int) -> bytes:
    name = repr(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise AttachmentError(f"no file at {name}: check the path", path=path) from None
    except OSError as exc:
        raise AttachmentError(f"cannot read {name}: {exc.strerror}", path=path) from None
    if stat.S_ISDIR(info.st_mode):
        raise AttachmentError(f"{name} is a directory, not a file: give a file path", path=path)
    _check_size(info.st_size, max_bytes, name)
    try:
        with open(path, "rb") as handle:
            # Read one byte past the limit: the file may have grown since stat.
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise AttachmentError(f"cannot read {name}: {exc.strerror}", path=path) from None
    _check_size(len(data), max_bytes, name)
    return data


def _check_size(size: int, max_bytes: int, name: str) -> None:
    if size == 0:
        raise AttachmentError(f"{name} is empty: an attachment needs at least one byte")
    if size > max_bytes:
        raise AttachmentError(
            f"{name} is {_human(size)}, over the {_human(max_bytes)} limit;"
            f" pass a larger max_bytes= (in bytes) to accept it",
            size=size,
            max_bytes=max_bytes,
        )


def _describe(data: bytes, mime: str | None) -> str:
    if mime is not None:
        return _KIND[mime]
    return f"of an unknown type (first bytes {data[:8].hex(' ')})"


def _human(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB ({size} bytes)"
    return f"{size / defaults.MiB:.1f} MiB ({size} bytes)"
