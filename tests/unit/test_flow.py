import os
import re

from gateway.flow import CallIds


def test_call_ids_are_unique_hex_and_drawn_again_in_a_forked_child() -> None:
    ids = CallIds()
    mine = [ids.new() for _ in range(10_000)]
    assert len(set(mine)) == len(mine)
    assert all(re.fullmatch("[0-9a-f]{24}", i) for i in mine)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out without the parent's cleanup
        os.write(write, ids.new().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert re.fullmatch("[0-9a-f]{24}", child)
    assert child[:12] != mine[0][:12]  # another process: another prefix
    assert child not in mine
