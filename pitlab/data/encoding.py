"""Text encodings of input files: where a file stops being valid in its declared encoding, in words."""

from __future__ import annotations

import codecs
from pathlib import Path

UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def check_encoding_name(name: str) -> str:
    """``name`` if Python knows the codec and it is a text encoding; raises ``ValueError`` otherwise."""
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise ValueError(f"unknown encoding {name!r} (e.g. utf-8, utf-16, latin-1, cp1252, shift_jis)") from None
    if not getattr(info, "_is_text_encoding", True):
        raise ValueError(f"{name!r} is not a text encoding")
    return name


COMPRESSED = ((b"\x1f\x8b", "gzip-compressed"), (b"PK\x03\x04", "a zip archive"), (b"BZh", "bzip2-compressed"),
              (b"\xfd7zXZ\x00", "xz-compressed"), (b"\x28\xb5\x2f\xfd", "zstd-compressed"))
"""Leading bytes of compressed files (a corpus is read as text)."""


def decode_problem(path: Path, encoding: str, field: str | None = None) -> str:
    """Why ``path`` cannot be read as ``encoding``: ``<path>: line L, byte offset B: bytes ... are not valid
    <encoding> (...)`` with a hint (a UTF-16 byte-order mark; Latin-1 or cp1252 text), or that the file is
    compressed (gzip, zip, bzip2, xz, zstd: :data:`COMPRESSED`), naming the spec
    ``field`` that sets the encoding when given. Reads the file once; call it after a decode failed."""
    data = Path(path).read_bytes()
    try:
        data.decode(encoding)
    except UnicodeDecodeError as err:
        start, end, reason = err.start, err.end, err.reason
    else:  # decoded whole here: the reader failed on something else
        return f"{path}: cannot be read as {encoding}"
    line = data[:start].decode(encoding, errors="replace").count("\n") + 1
    bad = data[start:min(end, start + 4) if end > start else start + 1]
    packed = next((what for magic, what in COMPRESSED if data.startswith(magic)), None)
    if packed is not None:  # no encoding reads it: the bytes are compressed, not text
        return (f"{path}: the file is {packed} (it starts with bytes {data[:4].hex(' ')}), not text: decompress it "
                "and give the uncompressed file")
    hint = ""
    if data.startswith(UTF16_BOMS) and codecs.lookup(encoding).name != "utf-16":
        hint = "; the file starts with a UTF-16 byte-order mark: it is UTF-16 text"
    elif codecs.lookup(encoding).name == "utf-8":
        hint = "; the file is not UTF-8 (Latin-1 or Windows-1252 text, e.g. 'é' written as one byte 0xe9?)"
    how = f"; set {field} (e.g. utf-16, latin-1, cp1252) to read another encoding" if field else \
        "; convert the file to UTF-8"
    return (f"{path}: line {line}, byte offset {start}: byte(s) {bad.hex(' ')} are not valid {encoding} "
            f"({reason}){hint}{how}")


def separator_hint(header) -> str:
    """``"; ..."``: a hint when a CSV header read as one field holds another separator (``;``, a tab, ``|``),
    as a file written with a decimal-comma locale's separator is; else ``""``."""
    if len(header) != 1:
        return ""
    seps = [name for sep, name in ((";", "';'"), ("\t", "tabs"), ("|", "'|'")) if sep in header[0]]
    return f"; the header is one field holding {seps[0]}: pitlab reads comma-separated files" if seps else ""
