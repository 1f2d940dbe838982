"""ccs_json_plain (jvm/src/ccselect/udf/JsonPlain.java), the parse's one-pass check: whenever it
says a line is plain, Python's own reading of the line agrees — one JSON object, no top-level key
repeated, each listed field null or of its JSON type — and the records the agents write are plain.
It may say "not sure" of a fine line (the diagnosis then decides); it must never call a bad one
plain. Then the one case it catches that the old check did not: a quoted number in a feature
`ingest.missing_features: impute` lets be null."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from ccselect.spark import JSON_PLAIN, register_json_record, register_udfs
from ccselect.jobs.parse import PLAIN, _spec, _with_record, imputable, parse, schema
from tests.test_ingest_parse import expect, lines_df, transport

SPEC = {"conn_id": "s", "cc": "s", "mss_bytes": "i", "min_rtt_us": "i"}
SPEC_TEXT = ",".join(f"{k}:{v}" for k, v in SPEC.items())
#: SPEC's fields as a from_json schema and as a struct type
RECORD_FIELDS = ", ".join(f"{k} {'string' if v == 's' else 'bigint'}" for k, v in SPEC.items())
RECORD_TYPE = "struct<" + ",".join(f"{k}:{'string' if v == 's' else 'bigint'}" for k, v in SPEC.items()) + ">"


def plain(spark, texts: list[str | None]) -> list[int | None]:
    register_udfs(spark)
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    rows = df.select("i", F.call_function(JSON_PLAIN, "t", F.lit(SPEC_TEXT)).alias("p")).collect()
    return [r["p"] for r in sorted(rows, key=lambda r: r["i"])]


def python_says_plain(text: str) -> bool:
    """The reference: Python's json reads one object, no top-level key twice, each SPEC field
    null, a string (s) or an int of at most 18 digits (i)."""
    try:
        top = json.JSONDecoder(object_pairs_hook=lambda pairs: pairs).decode(text)
    except ValueError:
        return False
    if not text.strip().startswith("{") or len({k for k, _ in top}) != len(top):
        return False
    for k, v in top:
        kind = SPEC.get(k)
        if v is None or kind is None:
            continue
        if kind == "s" and not isinstance(v, str):
            return False
        if kind == "i" and (isinstance(v, bool) or not isinstance(v, int) or len(str(abs(v))) > 18):
            return False
    return True


def test_cases(spark):
    good = '{"conn_id": "c1", "cc": "bbr", "mss_bytes": 1448, "min_rtt_us": -5}'
    cases = [
        (good, 1),
        (json.dumps(json.loads(good), separators=(",", ":")), 1),
        (' \t{ "conn_id" : "c1" ,"cc":null, "x": {"cc": 1, "cc": 2}, "y": [1, "]", {"a": "}"}] } \r', 1),
        ('{}', 1),
        ('{"conn_id": "a\\"b", "note": "\\\\", "cc": "bbr"}', 1),           # escapes in values
        (None, None),
        ('{"conn_id": "c1", "cc": "bbr", "cc": "cubic"}', 0),              # a field repeated
        ('{"z": 1, "conn_id": "c1", "z": 2}', 0),                          # an unknown key repeated
        ('{"c\\u0063": "bbr", "cc": "x"}', 0),                              # an escaped key
        ('{"conn_id": 7}', 0), ('{"cc": true}', 0), ('{"cc": ["bbr"]}', 0), ('{"cc": {"a": 1}}', 0),
        ('{"mss_bytes": "1448"}', 0), ('{"mss_bytes": 1.5}', 0), ('{"mss_bytes": 1e3}', 0),
        ('{"mss_bytes": 1234567890123456789}', 0),                          # 19 digits: not sure
        ('{"mss_bytes": true}', 0), ('{"mss_bytes": -}', 0),
        ("{'conn_id': 'c1'}", 0),                                           # single quotes (from_json reads them)
        ('{"conn_id": "c1"} x', 2), ('{"conn_id": "c1"}{}', 2),       # text after the object
        ('{"conn_id": "c1",}', 0), ('{"conn_id": "c1"', 0), ('{"conn_id" "c1"}', 0),
        ('{"conn_id": "c1', 0), ('[1, 2]', 0), ('', 0), ('1700000000.123 n1 1.2.3.4', 0),
    ]
    got = plain(spark, [c[0] for c in cases])
    assert got == [c[1] for c in cases], [(c[0], g) for c, g in zip(cases, got) if g != c[1]]
    for text, want in cases:
        if want == 1:
            assert python_says_plain(text), text
    assert plain(spark, ['{"mss_bytes": 0}', '{"mss_bytes": -0}', '{"mss_bytes": 012}', '{"x": NaN}', "{\"x\": 'a'}"]) \
        == [1, 1, 0, 1, 0]


_value = st.recursive(st.none() | st.booleans() | st.integers(-(10 ** 20), 10 ** 20) | st.floats(allow_nan=False)
                      | st.text(max_size=6), lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=4), v, max_size=3),
                      max_leaves=6)
_key = st.sampled_from([*SPEC, "x", "y", "ü"]) | st.text(max_size=5)


@st.composite
def lines(draw):
    """JSON objects with keys drawn from SPEC's and others (repeats included), values of any type,
    any spacing; then, at times, a cut or a character changed."""
    pairs = draw(st.lists(st.tuples(_key, _value), max_size=7))
    sep = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : "), (",\t", ":\r ")]))
    body = sep[0].join(json.dumps(k, ensure_ascii=draw(st.booleans())) + sep[1] + json.dumps(v) for k, v in pairs)
    text = draw(st.sampled_from(["", " "])) + "{" + body + "}"
    how = draw(st.sampled_from(["as is", "as is", "cut", "char"]))
    if how == "cut" and len(text) > 1:
        text = text[:draw(st.integers(1, len(text) - 1))]
    elif how == "char":
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + draw(st.sampled_from(['"', "{", "}", ",", ":", "\\", "'", "x"])) + text[i + 1:]
    return text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(lines(), min_size=20, max_size=20))
def test_never_plain_when_python_disagrees(spark, texts):
    """Plain means Python agrees, or the text is no JSON at all and from_json reads every field as
    null (the parse then diagnoses it: a required field is missing). "Not sure" of a fine line
    costs time, not correctness."""
    register_udfs(spark)
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    rows = df.select("i", "t", F.call_function(JSON_PLAIN, "t", F.lit(SPEC_TEXT)).alias("p"),
                     F.from_json("t", RECORD_FIELDS).alias("j")).collect()
    for r in rows:
        if r["p"] == 1:
            unread = r["j"] is None or all(v is None for v in r["j"])
            assert python_says_plain(r["t"]) or unread, r["t"]


def test_agent_records_are_plain(spark):
    texts = [json.dumps(transport(conn_id=f"c{i}")) for i in range(3)] + [json.dumps(transport(), separators=(",", ":"))]
    df = spark.createDataFrame([(t,) for t in texts], "raw string")
    got = _with_record(df, F.col("raw"), "transport", schema("transport")).select("_plain").collect()
    assert [r[0] for r in got] == [PLAIN] * 4


def test_what_the_old_check_let_through(spark):
    """A quoted number in a feature `ingest.missing_features: impute` lets be null (from_json read
    it as null: the record was accepted as imputed), text after the record (from_json and
    json_object_keys read the first object and stopped: accepted), and a record in single quotes
    (not JSON, but Spark's reader takes it: accepted)."""
    f = "init_snd_wnd_bytes"        # imputable by default (ingest.imputable_features)
    good = json.dumps(transport(conn_id="c4"))
    lines = [json.dumps(transport(conn_id="c1")), json.dumps(transport(conn_id="c2", **{f: "1000"})),
             json.dumps(transport(conn_id="c3", **{f: None})), good + " x", good + good,
             json.dumps(transport(conn_id="c5")).replace('"', "'")]
    got = parse(lines_df(spark, "transport", lines), "transport", imputable("impute", "transport"))
    assertDataFrameEqual(got.select("line_no", "status", "reason"),
                         expect(spark, [None, f"wrong_type:{f}", None, "bad_json", "bad_json", "bad_json"]))


def test_the_jar_goes_to_spark_submit_beside_the_packages():
    """The jar reaches spark-submit as `--jars`, where it is merged with the Maven packages' jars;
    a session conf `spark.jars` would replace that merged list and leave a cluster's executors
    without Delta (the cluster tests run it for real). Arguments already there are kept."""
    from ccselect.spark import submit_args
    assert submit_args("", "/r/u.jar") == "--jars /r/u.jar pyspark-shell"
    assert submit_args("--driver-memory 2g pyspark-shell", "/r/u.jar") == \
        "--jars /r/u.jar --driver-memory 2g pyspark-shell"
    assert submit_args("--jars /a.jar pyspark-shell", "/r/u.jar") == "--jars /a.jar,/r/u.jar pyspark-shell"
    assert submit_args("--jars=/a.jar pyspark-shell", "/r/u.jar") == "--jars=/a.jar,/r/u.jar pyspark-shell"
    once = submit_args("", "/r/my dir/u.jar")
    assert submit_args(once, "/r/my dir/u.jar") == once == "--jars '/r/my dir/u.jar' pyspark-shell"



def records(spark, texts: list[str | None]):
    """(ccs_json_record's plain and record, from_json's record) per text, in order."""
    df = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "i int, t string")
    register_json_record(spark, "ccs_json_record_test", RECORD_TYPE)
    rows = df.select("i", F.call_function("ccs_json_record_test", "t", F.lit(SPEC_TEXT)).alias("r"),
                     F.from_json("t", RECORD_FIELDS).alias("j")).collect()
    return [(r["r"] and r["r"]["plain"], r["r"] and r["r"]["record"], r["j"]) for r in sorted(rows, key=lambda r: r["i"])]


def test_record_cases(spark):
    """ccs_json_record reads a plain line of simple values itself, exactly as from_json does, and
    leaves every other line to from_json (record null); its plain answer is ccs_json_plain's."""
    simple = ['{"conn_id": "c1", "cc": "bbr", "mss_bytes": 1448, "min_rtt_us": -5}', '{}',
              '{"conn_id":"c1","mss_bytes":-0,"x":true,"y":false,"z":null,"w":"ü ✓","n":123}',
              ' {"cc": null, "mss_bytes": 0} ', '{"conn_id": ""}']
    not_simple = ['{"conn_id": "a\\"b"}', '{"conn_id": "a\\u0062"}', '{"x": 1.5, "cc": "bbr"}', '{"x": [1]}',
                  '{"x": {"a": 1}}', '{"x": NaN}', '{"x": nullx, "cc": "a"}', '{"cc": nullx}', '{"x": tru}',
                  '{"conn_id": "a\tb"}', '{"x\ty": 1}', '{"x": 1234567890123456789012}',
                  '{"%s": 1}' % ("k" * 1001), '{"conn_id": "%s"}' % ("v" * 1_000_001)]
    other = ['{"conn_id": "c1"} x', '{"cc": "a", "cc": "b"}', '{"mss_bytes": "1448"}', "{'cc': 'a'}", '[1]', '', None]
    got = records(spark, simple + not_simple + other)
    assert plain(spark, simple + not_simple + other) == [g[0] for g in got]
    for text, (p, rec, j) in zip(simple, got):
        assert p == 1 and rec is not None and rec.asDict() == j.asDict(), text
    for text, (p, rec, j) in zip(not_simple + other, got[len(simple):]):
        assert rec is None, text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(lines(), min_size=20, max_size=20))
def test_record_is_what_from_json_reads(spark, texts):
    """Whenever ccs_json_record gives a record, it is field for field from_json's."""
    for text, (p, rec, j) in zip(texts, records(spark, texts)):
        if rec is not None:
            assert p == 1 and j is not None and rec.asDict() == j.asDict(), text


def test_agent_records_take_the_fast_path(spark):
    """The records the agents write are read by ccs_json_record (the parse's `_with_record`), not
    by from_json, and the parse's record is from_json's."""
    sch = schema("transport")
    texts = [json.dumps(transport(conn_id=f"c{i}")) for i in range(3)] + [json.dumps(transport(), separators=(",", ":"))]
    df = spark.createDataFrame([(t,) for t in texts], "raw string")
    scanned = _with_record(df, F.col("raw"), "transport", sch).select("_json").collect()
    assert scanned == df.select(F.from_json("raw", sch).alias("_json")).collect()
    fast = df.select(F.call_function("ccs_json_record_transport", "raw", F.lit(_spec(sch)))["record"].isNotNull())
    assert [r[0] for r in fast.collect()] == [True] * 4
