"""common/errors.py: a write that found no room is named as the disk's fault wherever it is raised and however a
library wraps it; running out of memory names the setting the caller gives."""
from __future__ import annotations

import errno

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import NO_ROOM, UserError, out_of_memory, out_of_room, user_errors_exit

names = st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), min_size=1, max_size=30)


def _wrapped(inner: BaseException, depth: int, as_cause: bool) -> BaseException:
    """inner under `depth` library errors, chained as a cause (`raise ... from`) or a context."""
    error = inner
    for level in range(depth):
        outer = RuntimeError(f"library error {level}")
        if as_cause:
            outer.__cause__ = error
        else:
            outer.__context__ = error
        error = outer
    return error


@settings(max_examples=100, deadline=None)
@given(code=st.sampled_from([*NO_ROOM, errno.EACCES, errno.EIO, errno.ENOENT]), filename=st.none() | names,
       writing=names, depth=st.integers(0, 3), as_cause=st.booleans())
def test_a_write_without_room_names_the_file_or_else_the_folder_being_written(code, filename, writing, depth,
                                                                               as_cause):
    error = out_of_room(_wrapped(OSError(code, "strerror", filename), depth, as_cause), writing)
    if code not in NO_ROOM:
        assert error is None
        return
    cause, fix = NO_ROOM[code]
    assert str(error) == f"cannot write '{filename or writing}' ({cause}: strerror): {fix}"


def test_the_front_ends_catch_a_full_disk_from_anywhere_and_let_other_os_errors_through(capsys):
    with pytest.raises(SystemExit) as exit_info, user_errors_exit("prog"):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/x.bin")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("prog: error: cannot write '/data/x.bin' (the disk is full: No space left on "
                                       "device): free space on that disk, or write somewhere with room\n")
    with pytest.raises(PermissionError), user_errors_exit("prog"):  # a bug or not ours to word: its traceback
        raise PermissionError(errno.EACCES, "Permission denied")


@pytest.mark.parametrize("error, is_oom", [
    (MemoryError(), True), (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 bytes"), True),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True), (RuntimeError("a bug"), False),
    (type("OutOfMemoryError", (RuntimeError,), {})("x"), True), (ValueError("Out Of Memory"), True),
])
def test_out_of_memory_names_the_given_setting_and_nothing_else_is_taken_for_it(error, is_oom):
    found = out_of_memory(error, "cpu", "lower eval.batch_size")
    assert (found is not None) == is_oom
    if found is not None:
        assert isinstance(found, UserError) and str(found).startswith("out of memory on cpu (")
        assert str(found).endswith("): lower eval.batch_size")



def test_a_chain_of_errors_that_loops_back_ends_without_a_no_room_error():
    """A library can leave an exception as its own context's context: the walk stops at the first one seen
    again, and a loop holding no no-room error is None, however the loop is entered."""
    first, second = RuntimeError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    assert out_of_room(first, "folder") is None and out_of_room(second, "folder") is None
    room = OSError(errno.ENOSPC, "No space left on device")
    second.__context__ = room
    room.__context__ = first
    assert "the disk is full" in str(out_of_room(first, "folder"))
