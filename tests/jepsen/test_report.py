"""Reports: the text summary, the JSON object and the self-contained HTML page."""

from __future__ import annotations

import json
import re

from jepsen.checker import check
from jepsen.models import KvModel, RegisterModel
from jepsen.report import fill_page, html_report, result_json, script_json, text_summary
from tests.jepsen.helpers import history

STALE = history("""
    0 invoke write 1
    0 ok write 1
    nemesis info partition "n1 | n2 n3"
    0 invoke write 2
    0 ok write 2
    1 invoke read
    1 ok read 1""")


def embedded_data(page: str) -> dict[str, object]:
    match = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert match is not None
    data: dict[str, object] = json.loads(match.group(1))
    return data


def test_the_text_summary_of_a_failure() -> None:
    result = check(RegisterModel(0), STALE)
    summary = text_summary(STALE, result, format="jsonl")
    assert summary.splitlines()[0] == ("history (jsonl): 3 operations (3 checked), model "
                                       "register, initial 0")
    assert "verdict: NOT linearizable (1 partition," in summary
    assert "no order explains the completion at event 6 of" in summary
    assert "op 2 (process 1, events 5-6): read -> 1" in summary
    assert "state after the linearizable prefix: 2" in summary


def test_the_text_summary_of_a_pass_is_two_lines() -> None:
    result = check(RegisterModel(0), history("0 invoke write 1\n0 ok write 1"))
    assert len(text_summary(STALE, result).splitlines()) == 2


def test_the_json_object() -> None:
    document = result_json(STALE, check(RegisterModel(0), STALE), format="jsonl")
    assert document["verdict"] == "not-linearizable"
    assert document["operations"] == 3
    failure = document["failure"]
    assert isinstance(failure, dict)
    assert failure["operation"]["description"] == "read -> 1"
    assert failure["linearization"] == [[0, "1"], [1, "2"]]
    json.dumps(document)  # serialisable as it is


def test_the_page_is_self_contained_and_carries_the_evidence() -> None:
    page = html_report(STALE, check(RegisterModel(0), STALE))
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page
    assert "<link" not in page
    assert "src=" not in page
    data = embedded_data(page)
    assert data["verdict"] == "not-linearizable"
    assert len(data["operations"]) == 3  # type: ignore[arg-type]
    assert data["others"] == [{"index": 2, "process": "nemesis",
                               "text": 'partition "n1 | n2 n3"'}]
    assert data["failure"] == {"partition": 0, "operation": 2, "window": [1, 2],
                               "prefix_events": 6, "exact": True}
    parts = data["partitions"]
    assert isinstance(parts, list)
    (part,) = parts
    assert part["steps"] == [[0, "1"], [1, "2"]]
    assert part["initial"] == "0"


def test_history_text_cannot_break_out_of_the_page() -> None:
    hist = history('0 invoke write "</script><script>alert(1)</script>"\n0 ok write "x"')
    page = html_report(hist, check(RegisterModel(0), hist))
    assert "</script><script>alert" not in page
    assert embedded_data(page)["operations"][0]["text"].startswith(  # type: ignore[index]
        'write "</script>')


def test_a_placeholder_in_history_text_stays_text() -> None:
    # The summary names the read's value, "$DATA": filled in turn, it pasted the raw JSON, and
    # the write's markup with it, into the page.
    hist = history("""
        0 invoke write "<img src=x onerror=alert(1)>"
        0 ok write "<img src=x onerror=alert(1)>"
        1 invoke read
        1 ok read "$DATA"
        """)
    page = html_report(hist, check(RegisterModel(None), hist))
    assert "<img" not in page
    assert 'read -&gt; &quot;$DATA&quot;' in page
    operations = embedded_data(page)["operations"]
    assert [op["text"] for op in operations] == [  # type: ignore[attr-defined]
        'write "<img src=x onerror=alert(1)>"', 'read -> "$DATA"']


def test_the_template_is_filled_in_one_pass() -> None:
    page = fill_page("<h1>$TITLE</h1><pre>$SUMMARY</pre><script>$DATA</script>",
                     {"TITLE": "$SUMMARY", "SUMMARY": "$DATA", "DATA": "{}"})
    assert page == "<h1>$SUMMARY</h1><pre>$DATA</pre><script>{}</script>"


def test_embedded_json_has_no_markup_characters() -> None:
    document = {"text": "<!-- </script> & <b>"}
    embedded = script_json(document)
    assert not set("<>&") & set(embedded)
    assert json.loads(embedded) == document


def test_a_partitioned_page_lists_every_partition() -> None:
    hist = history("""
        0 invoke put 1 key=a
        0 ok put 1 key=a
        1 invoke put 2 key=b
        1 ok put 2 key=b""")
    data = embedded_data(html_report(hist, check(KvModel(), hist)))
    labels = [part["label"] for part in data["partitions"]]  # type: ignore[attr-defined]
    assert labels == ['key "a"', 'key "b"']
    assert data["failure"] is None
