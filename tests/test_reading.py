"""stages/bench/reading.py's rule: support a stage rests on (``common/numerics/``, a stage's ``schema/``) is counted
in its own column, apart from the lesson, and no file the lesson read before the rule disappears from view.

The oracles are independent of the reader: the support folder's files listed from disk, and the reader itself with
the rule switched off (every file it read then is read now, in the lesson or apart)."""
from __future__ import annotations

from stages.bench import reading

SCHEMA = reading.ROOT / "stages" / "07_structured" / "schema"


def test_a_support_folder_is_counted_apart_from_the_lesson():
    read = reading.read_set("07_structured")
    support = reading.support_of(read)
    on_disk = set(SCHEMA.glob("*.py"))
    assert on_disk and on_disk <= support["stages/07_structured/schema/"]  # all of it reached, all of it apart
    assert not on_disk & set(read)
    assert not set().union(*support.values()) & set(read)  # a file is counted once: lesson or support
    assert reading.ROOT / "stages" / "07_structured" / "backends.py" in read  # the backends stay in the lesson


def test_no_file_disappears_from_view(monkeypatch):
    for folder in ("03_paged_kv", "07_structured"):
        read = set(reading.read_set(folder))
        apart = set().union(*reading.support_of(sorted(read)).values())
        with monkeypatch.context() as m:
            m.setattr(reading, "SUPPORT_PACKAGES", ())
            before = set(reading.read_set(folder))
        assert before <= read | apart, folder


def test_the_core_numerics_are_support():
    read = reading.read_set("03_paged_kv")
    support = reading.support_of(read)
    assert reading.ROOT / "common" / "model.py" in read
    assert reading.ROOT / "common" / "numerics" / "attention.py" in support["common/numerics/"]
    assert not any(p.is_relative_to(reading.ROOT / "common" / "numerics") for p in read)
