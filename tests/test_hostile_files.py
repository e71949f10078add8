"""Files the job writes at a path it was given, in a directory another local user can write (issue 48, item 5).

The docs suggest ``HOROVOD_TIMELINE=/tmp/timeline.json``. Before the fix the job opened it with ``open(path, "w")``,
so another user's symlink planted there made the job (often root) overwrite the link's target. Now a symlink, and
a file that is not this user's own, are refused with an error naming the path, and their targets are untouched;
the same path, once free, is written as before (the reference). The planting is done by the second local user of
``tests/test_hostile_user.py`` (root only, skipped otherwise) in a sticky, world-writable directory like ``/tmp``.
"""

import json
import os
import shutil
import tempfile
import textwrap

import numpy as np
import pytest

from horovod.common.safe_files import UnsafePathError, open_for_writing
from horovod.testing import spawn_ranks

from test_hostile_user import stranger  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.ranks]

PLANT = textwrap.dedent("""
    import os, sys
    kind, target, where = sys.argv[1:]
    if kind == "symlink":
        os.symlink(target, where)
    else:
        with open(where, "w") as handle:
            handle.write("the other user's file")
    print("planted", flush=True)
""")


def _with_timeline(path):
    import horovod.numpy as hvd
    hvd.init()
    hvd.allreduce(np.ones(4), op=hvd.Sum, name="traced")
    hvd.shutdown()
    return True


@pytest.fixture
def shared_dir():
    where = tempfile.mkdtemp(prefix="hvd-shared-", dir="/tmp")
    os.chmod(where, 0o1777)          # like /tmp: anyone may create names here, and only remove their own
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_timeline_path_planted_by_another_user_is_refused(stranger, shared_dir, tmp_path, kind):  # noqa: F811
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = os.path.join(shared_dir, "timeline.json")
    planted = stranger.start(PLANT, kind, str(victim), path).stop(timeout=30)
    assert planted[0] == ["planted"], planted
    with pytest.raises(Exception) as caught:
        spawn_ranks(_with_timeline, 1, timeout=60, args=(path,), env={"HOROVOD_TIMELINE": path})
    said = str(caught.value)
    assert path in said and ("symlink" in said if kind == "symlink" else "refusing to overwrite" in said), said
    assert victim.read_text() == "precious"
    if kind == "file":
        with open(path) as handle:
            assert handle.read() == "the other user's file"
    # The reference: once the name is free, the same job writes its timeline there.
    os.unlink(path)
    assert spawn_ranks(_with_timeline, 1, timeout=60, args=(path,), env={"HOROVOD_TIMELINE": path}) == [True]
    with open(path) as handle:
        assert any(event.get("name") == "traced" or "traced" in json.dumps(event) for event in json.load(handle))


def test_the_safe_opener_refuses_links_and_foreign_files_and_writes_its_own(tmp_path):
    own = tmp_path / "own.json"
    own.write_text("old contents, longer than the new")
    with open_for_writing(str(own), "the test") as handle:
        handle.write("new")
    assert own.read_text() == "new"
    os.symlink(own, tmp_path / "link.json")
    with pytest.raises(UnsafePathError, match="is a symlink"):
        open_for_writing(str(tmp_path / "link.json"), "the test")
    os.link(own, tmp_path / "second-name.json")
    with pytest.raises(UnsafePathError, match="2 links"):
        open_for_writing(str(own), "the test")
    assert own.read_text() == "new"
