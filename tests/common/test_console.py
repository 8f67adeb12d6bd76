"""common/console.py: every write to stdout or stderr goes through a GuardedStream, which cannot raise:
unencodable text is escaped, a closed reader ends the command with 141, any other failed write is one line
naming the stream and exit 2, or, for a command that goes on, a warning and nothing more from that stream."""
from __future__ import annotations

import errno
import io
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import console
from common.errors import NO_ROOM, write_failure


class FailingStream(io.StringIO):
    """A stream whose writes fail with `code` from the `after`-th on, as a pipe closed by its reader or a full
    device fails."""

    def __init__(self, code: int, after: int):
        super().__init__()
        self.code, self.after, self.calls = code, after, 0

    def write(self, text: str) -> int:
        self.calls += 1
        if self.calls > self.after:
            raise (BrokenPipeError if self.code == errno.EPIPE else OSError)(self.code, "simulated")
        return super().write(text)


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF)),
       encoding=st.sampled_from(["utf-8", "ascii", "latin-1"]))
def test_any_text_is_written_and_what_the_encoding_cannot_hold_is_escaped(text, encoding):
    raw = io.BytesIO()
    inner = io.TextIOWrapper(raw, encoding=encoding, errors="strict", newline="")
    stream = console.GuardedStream(inner, "stdout", console.Printer("prog", None))
    assert stream.write(text) == len(text)
    stream.flush()
    assert raw.getvalue() == text.encode(encoding, "backslashreplace")


def _install_streams(monkeypatch, printer, stdout_inner):
    stderr_inner = io.StringIO()
    stdout = console.GuardedStream(stdout_inner, "stdout", printer)
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", console.GuardedStream(stderr_inner, "stderr", printer))
    return stdout, stderr_inner


FAILURES = [errno.EPIPE, errno.ECONNRESET, *NO_ROOM, errno.EIO]


@settings(max_examples=60, deadline=None)
@given(code=st.sampled_from(FAILURES), after=st.integers(0, 3), lines=st.lists(st.text(max_size=20), min_size=5,
                                                                                  max_size=8))
def test_a_failed_stdout_ends_the_command_with_141_for_a_closed_reader_else_one_line_and_2(code, after, lines):
    with pytest.MonkeyPatch.context() as mp:
        stdout, err = _install_streams(mp, console.Printer("prog", None), FailingStream(code, after))
        with pytest.raises(SystemExit) as exit_info:
            for line in lines:
                print(line)
    closed = code in console.CLOSED
    assert exit_info.value.code == (console.EXIT_CLOSED_PIPE if closed else 2)
    said = err.getvalue().splitlines()
    if closed:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith("prog: error: cannot write to stdout (")
        assert f"({write_failure(OSError(code, 'simulated'))})" in said[0]  # the cause first, where it is the disk
    assert stdout.failed and stdout._inner.getvalue() == "".join(f"{line}\n" for line in lines)[:len(
        stdout._inner.getvalue())]


@settings(max_examples=60, deadline=None)
@given(code=st.sampled_from(FAILURES), after=st.integers(0, 3), lines=st.lists(st.text(max_size=20), max_size=8))
def test_a_command_that_goes_on_keeps_going_with_at_most_one_warning(code, after, lines):
    with pytest.MonkeyPatch.context() as mp:
        stdout, err = _install_streams(mp, console.Printer("prog", "it goes on"), FailingStream(code, after))
        for line in lines:
            print(line)
        print("after")
        sys.stdout.flush()
    said = err.getvalue().splitlines()
    assert stdout.failed == (stdout._inner.calls > after)  # the first failure, and no write after it
    if code in console.CLOSED or not stdout.failed:
        assert said == []
    else:
        assert said == [f"prog: warning: cannot write to stdout ({write_failure(OSError(code, 'simulated'))}); "
                        f"it goes on"]
    written = stdout._inner.getvalue()
    assert written == "".join(f"{line}\n" for line in [*lines, "after"])[:len(written)]  # a prefix, then nothing


def test_installing_wraps_the_real_streams_once_and_a_process_without_stdout_prints_nothing(monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)  # started with stdout closed (`>&-`)
    real_err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", real_err)
    console.install("one")
    console.install("two", goes_on="it goes on")
    assert sys.stderr._inner is real_err and sys.stdout._inner is None
    print("dropped")
    print("kept", file=sys.stderr)
    assert real_err.getvalue() == "kept\n" and sys.stderr._printer.prog == "two"


def test_installing_with_goes_on_makes_a_failed_stdout_a_warning_and_the_command_goes_on(monkeypatch):
    monkeypatch.setattr(sys, "stdout", FailingStream(errno.EIO, 0))
    real_err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", real_err)
    console.install("train.py", goes_on="the run goes on")
    print("lost")  # no SystemExit: the command goes on
    print("still here", file=sys.stderr)
    assert real_err.getvalue().splitlines() == [
        f"train.py: warning: cannot write to stdout ({write_failure(OSError(errno.EIO, 'simulated'))}); "
        f"the run goes on", "still here"]


def test_everything_but_writing_is_the_real_streams(tmp_path):
    with open(tmp_path / "out.txt", "w", encoding="latin-1") as inner:
        stream = console.GuardedStream(inner, "stdout", console.Printer("prog", None))
        assert stream.fileno() == inner.fileno() and stream.encoding == "latin-1"
        assert stream.isatty() is False and stream.name == "stdout"


def test_a_dropped_stream_sends_what_its_descriptor_still_gets_to_dev_null(tmp_path):
    """drop() points the real descriptor at /dev/null: what the interpreter still flushes for it (here: a
    write straight to the descriptor) reaches neither the file nor an exception."""
    path = tmp_path / "out.txt"
    with open(path, "w") as inner:
        stream = console.GuardedStream(inner, "stdout", console.Printer("prog", "it goes on"))
        stream.write("before\n")
        stream.flush()
        stream.drop()
        assert stream.failed
        os.write(inner.fileno(), b"after the drop\n")
        stream.write("not written\n")
        stream.flush()
    assert path.read_text() == "before\n"


def test_a_strict_stream_without_an_encoding_attribute_is_escaped_as_utf_8():
    class Strict:  # a stream object that refuses what ASCII cannot hold and says nothing of its encoding
        def __init__(self):
            self.parts = []

        def write(self, text):
            text.encode("ascii")
            self.parts.append(text)

    inner = Strict()
    console.GuardedStream(inner, "stdout", console.Printer("prog", None)).write("ab \ud800")
    assert inner.parts == ["ab \\ud800"]
