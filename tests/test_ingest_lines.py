"""Cutting files into lines (jobs.sources.read_lines, ccs_split_lines): line numbers, the final
newline, empty files and bytes that are not UTF-8, against Python's reading of the bytes and
against the Spark string functions the cut replaced."""
from __future__ import annotations

from pyspark.sql import functions as F

from ccselect.jobs.sources import SourceFile, read_lines

FILES = {
    "empty": b"",
    "newline_only": b"\n",
    "no_final_newline": b"a",
    "one_line": b"a\n",
    "blank_last_line": b"a\n\n",
    "blank_first_lines": b"\n\na",
    "crlf": b"x\r\ny\r\n",
    "bom": b"\xef\xbb\xbf{\"a\":1}\n{\"b\":2}\n",
    "not_utf8": b"ok\n\x00\xff\xfe garbage\nok again\n",
    "cut_sequence": b"\xe2\x82\nend \xe2\x82",
    "multibyte": "é € \U0001F600 \u2028 end\n".encode(),
    "overlong_and_surrogate": b"\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80\n",
}


#: Java's decoder (Spark's UTF8String.toString) replaces the three bytes of an encoded surrogate
#: with one U+FFFD where Python's replaces each byte
JAVA_DECODES_OTHERWISE = {"overlong_and_surrogate"}


def expected_lines(data: bytes) -> list[str]:
    """One line per newline-ended piece (a final newline starts no line); bytes that are not UTF-8
    read as U+FFFD."""
    if not data:
        return []
    text = data.decode("utf-8", errors="replace")
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def string_function_lines(spark, paths: list[str]) -> dict[str, list[str]]:
    """Path → its lines as the Spark string functions cut them before ccs_split_lines
    (jobs/sources.py), all files in one read (an empty file: the text source gives no row)."""
    body = F.regexp_replace("value", r"\n\z", "")
    lines = F.when(F.col("value") == "", F.array().cast("array<string>")).otherwise(F.split(body, "\n", -1))
    rows = spark.read.text(paths, wholetext=True).select(
        F.regexp_replace("_metadata.file_path", "^file:(//)?", "").alias("path"), lines.alias("l")).collect()
    return {r["path"]: r["l"] for r in rows}


def test_lines_numbered_from_one_with_the_files_bytes_decoded(spark, tmp_path):
    files = []
    for i, (name, data) in enumerate(FILES.items()):
        d = tmp_path / "access" / f"n{i}"
        d.mkdir(parents=True)
        (d / "2026-11-01T00.jsonl").write_bytes(data)
        files.append(SourceFile("access", f"n{i}", "2026-11-01T00", str(d / "2026-11-01T00.jsonl")))
    got = {}
    for r in read_lines(spark, files).collect():
        got.setdefault(r["node_id"], []).append((r["line_no"], r["raw"]))
    before = string_function_lines(spark, [f.path for f in files])
    for i, (name, data) in enumerate(FILES.items()):
        lines = sorted(got.get(f"n{i}", []))
        assert lines == list(enumerate(before.get(files[i].path, []), 1)), name
        if name not in JAVA_DECODES_OTHERWISE:
            assert lines == list(enumerate(expected_lines(data), 1)), name
    assert sum(len(expected_lines(d)) for d in FILES.values()) == sum(len(v) for v in got.values())
    # (the surrogate's line: one U+FFFD for its three bytes)
    assert got[f"n{list(FILES).index('overlong_and_surrogate')}"] == [(1, "\ufffd\ufffd|\ufffd|" + "\ufffd" * 4)]
