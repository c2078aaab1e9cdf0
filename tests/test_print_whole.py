"""Standard output written whole (output.print_whole): over a raw file
(``PYTHONUNBUFFERED=1``) one ``write`` takes only part of a large plan."""

import io
import os
import subprocess
import sys

from pipesearch.output import print_whole


class _Chunked(io.RawIOBase):
    """A raw stream that takes at most ``limit`` bytes per write, as a pipe does."""

    def __init__(self, limit: int):
        self.limit, self.data = limit, bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = min(len(b), self.limit)
        self.data += bytes(b[:n])
        return n


def test_every_byte_is_written_when_each_write_takes_a_part(monkeypatch):
    raw = _Chunked(1000)
    stream = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # its .buffer is the raw stream
    stream.buffer.write = raw.write
    monkeypatch.setattr(sys, "stdout", stream)
    text = "".join(f"line {k} é\n" for k in range(5000))  # 60 kB, non-ASCII included
    print_whole(text)
    assert raw.data.decode("utf-8") == text


def test_a_reader_gone_in_the_middle_gives_141_with_unbuffered_output():
    """``pipesearch plan --json | head -c 100`` with ``PYTHONUNBUFFERED=1``:
    the reader leaves while the plan (far more than a pipe holds) is being
    written; before, that write's part was taken as the whole and the exit
    status was 0."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "pipesearch", "plan", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert len(proc.stdout.read(100)) == 100  # the write has begun: the reader leaves in its middle
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and "error" not in err, err
