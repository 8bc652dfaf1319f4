"""The spool on a real file system: order, cap, damaged records, leftovers; and the memory
head that overflows into it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from trainvitals.agent.pending import PendingFrames
from trainvitals.agent.spool import STALE_AFTER, Spool
from trainvitals.agent.spool_format import HEAD_SEGMENT, HEADER, META_FILE, claim, read_segment
from trainvitals.agent.sync import load, spool_meta
from trainvitals.exceptions import SpoolError
from trainvitals.protocol import HelloFrame


def frame(seq: int, size: int = 100) -> str:
    return json.dumps({"type": "points", "v": 1, "seq": seq, "pad": "x" * size})


def segments(spool: Spool) -> list[Path]:
    assert spool.directory is not None
    return sorted(spool.directory.glob("*.seg"))


def read_all(spool: Spool) -> list[int]:
    return [seq for seq, _ in spool.read(max_bytes=2**30)]


def test_frames_come_back_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "run1", max_bytes=64 * 1024)
    assert spool.directory is None  # nothing on disk until needed
    for seq in range(1, 101):
        assert spool.append(seq, frame(seq))
    assert len(segments(spool)) > 1 and len(spool) == 100
    first = spool.read(max_bytes=1000)
    assert [seq for seq, _ in first] == list(range(1, len(first) + 1))
    assert json.loads(first[0][1])["seq"] == 1
    assert read_all(spool) == list(range(len(first) + 1, 101))
    assert len(spool) == 0 and spool.dropped == 0
    assert segments(spool) == []  # read files are deleted at once
    spool.close()
    assert list(tmp_path.iterdir()) == []


def test_the_cap_drops_the_oldest_frames_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cap = 16 * 1024
    spool = Spool(tmp_path, "run1", max_bytes=cap)
    record = HEADER.size + len(frame(1))
    with caplog.at_level(logging.WARNING, logger="trainvitals"):
        for seq in range(1, 1001):
            spool.append(seq, frame(seq))
            assert spool.size <= cap
            assert sum(p.stat().st_size for p in segments(spool)) == spool.size
    assert [r.message for r in caplog.records if "cap" in r.message] == [
        f"trainvitals: the spool of run run1 reached its cap of {cap} bytes "
        "($TRAINVITALS_SPOOL_MAX_BYTES); dropping its oldest frames to keep the latest"
    ]
    kept = read_all(spool)
    assert kept == list(range(1001 - len(kept), 1001))  # the newest, in order
    assert len(kept) > cap // record // 2
    assert spool.dropped == 1000 - len(kept)
    assert not spool.append(1001, "x" * cap)  # a frame larger than the cap never fits
    spool.close()


def test_a_torn_last_record_is_skipped(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "run1", max_bytes=2**20)
    for seq in range(1, 6):
        spool.append(seq, frame(seq))
    [path] = segments(spool)
    os.truncate(path, path.stat().st_size - 10)  # the process died in the middle of a write
    assert read_all(spool) == [1, 2, 3, 4]
    assert spool.dropped == 1
    spool.append(6, frame(6))  # and the spool carries on
    assert read_all(spool) == [6]
    spool.close()


def test_a_damaged_record_ends_its_segment_only(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "run1", max_bytes=16 * 1024)  # 1 KiB segments: 7 records each
    for seq in range(1, 21):
        spool.append(seq, frame(seq))
    first = segments(spool)[0]
    data = bytearray(first.read_bytes())
    data[HEADER.size + len(frame(1)) + HEADER.size + 5] ^= 0xFF  # a byte of record 2's payload
    first.write_bytes(bytes(data))
    assert read_all(spool) == [1, *range(8, 21)]
    assert spool.dropped == 6
    spool.close()


FULL_DISK = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from trainvitals.agent.spool import Spool

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))  # each file: 11 records fit
    spool = Spool(Path(sys.argv[1]), "run1", max_bytes=2**20)
    appended = [spool.append(seq, json.dumps({"pad": "x" * 316})) for seq in range(1, 21)]
    sizes = [p.stat().st_size for p in sorted(spool.directory.glob("*.seg"))]
    read = [seq for seq, _ in spool.read(2**20)]
    outcome = {"appended": appended, "sizes": sizes, "read": read, "dropped": spool.dropped}
    print(json.dumps(outcome))
    """
)


def test_a_failed_write_drops_that_frame_only(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outcome = json.loads(result.stdout)
    record = HEADER.size + len(json.dumps({"pad": "x" * 316}))
    assert outcome["appended"] == [True] * 11 + [False] + [True] * 8
    assert outcome["sizes"] == [11 * record, 8 * record]  # the torn record was cut off
    assert outcome["read"] == [*range(1, 12), *range(13, 21)]
    assert outcome["dropped"] == 1
    assert result.stderr.count("cannot write the spool") == 1


def test_an_unwritable_directory_falls_back_to_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "not-a-dir").write_text("")
    spool = Spool(tmp_path / "not-a-dir", "run1", max_bytes=2**20)
    with caplog.at_level(logging.WARNING, logger="trainvitals"):
        assert spool.append(1, frame(1))
    assert spool.directory is not None and spool.directory.parent.parent == tmp_path / "tmp"
    assert "cannot spool to" in caplog.text
    assert read_all(spool) == [1]
    spool.close()


def test_leftovers_of_dead_runs_are_removed_and_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    live = Spool(tmp_path, "live", max_bytes=2**20)  # its lock is held
    live.append(1, frame(1))
    dead = tmp_path / "dead"
    dead.mkdir()
    (dead / "lock").touch()
    (dead / "000001.seg").write_bytes(b"\x00\x00\x01")  # torn by the crash
    undelivered = tmp_path / "undelivered"  # a run.json: trainvitals sync delivers it
    undelivered.mkdir()
    (undelivered / "lock").touch()
    (undelivered / META_FILE).write_text("{}")
    (undelivered / HEAD_SEGMENT).touch()
    recent = tmp_path / "recent"  # free, but changed just now
    recent.mkdir()
    (recent / "lock").touch()
    photos = tmp_path / "photos"  # not a spool
    photos.mkdir()
    (photos / "cat.jpg").touch()
    (photos / "lock").touch()
    now = time.time()
    old = now - STALE_AFTER - 60
    for directory in (live.directory, dead, photos, undelivered):
        assert directory is not None
        for path in (*directory.iterdir(), directory):
            os.utime(path, (old, old))

    removed = Spool(tmp_path, "new", max_bytes=2**20).remove_leftovers(now=now)
    assert removed == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "live",
        "photos",
        "recent",
        "undelivered",
    ]
    assert read_all(live) == [1]  # the live run's spool still works
    live.close()


def test_memory_holds_the_oldest_frames_and_the_spool_the_rest(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "run1", max_bytes=2**20)
    pending = PendingFrames(memory_bytes=3 * len(frame(1)), spool=spool)
    for seq in range(1, 11):
        pending.push(seq, frame(seq))
    assert (len(pending), pending.spooled) == (10, 7)
    assert pending.in_memory_bytes <= pending.memory_bytes
    sent = [seq for seq, _ in pending.take()]
    assert sent == [1, 2, 3] and pending.take() == []
    pending.ack(2)  # room for two more, read back from the disk
    assert [seq for seq, _ in pending.take()] == [4, 5]
    pending.rewind()  # a new connection: what memory holds goes again
    assert [seq for seq, _ in pending.take()] == [3, 4, 5]
    delivered = [1, 2, 3, 4, 5]
    pending.ack(5)
    while pending:
        frames = pending.take()
        delivered += [seq for seq, _ in frames]
        pending.ack(frames[-1][0])
    assert delivered == list(range(1, 11))
    assert pending.in_memory_bytes == 0 and pending.dropped == 0
    pending.close()
    assert list(tmp_path.iterdir()) == []


def test_without_a_spool_frames_beyond_memory_are_dropped() -> None:
    pending = PendingFrames(memory_bytes=2 * len(frame(1)))
    for seq in range(1, 5):
        pending.push(seq, frame(seq))
    assert [seq for seq, _ in pending.take()] == [1, 2]
    assert pending.dropped == 2


def test_an_ack_beyond_memory_skips_spooled_frames(tmp_path: Path) -> None:
    pending = PendingFrames(memory_bytes=len(frame(1)), spool=Spool(tmp_path, "r", 2**20))
    for seq in range(1, 8):
        pending.push(seq, frame(seq))
    pending.ack(5)  # the server already had them (its welcome says last_seq 5)
    assert [seq for seq, _ in pending.take()] == [6]
    pending.close()


HELLO: HelloFrame = {
    "type": "hello", "v": 1, "run_id": "run1", "project": "p", "name": "n", "config": {},
    "host": "h", "pid": 1, "started_at": 0.0, "env": {}, "job": None, "run_secret": "s",
}  # fmt: skip


def test_what_memory_holds_at_the_end_is_kept_on_disk_and_read_back_once_in_order(
    tmp_path: Path,
) -> None:
    meta = spool_meta("http://127.0.0.1:9", HELLO)
    spool = Spool(tmp_path, "run1", max_bytes=16 * 1024, meta=meta)  # 1 KiB segments
    pending = PendingFrames(memory_bytes=3 * len(frame(1)), spool=spool)
    for seq in range(1, 31):
        pending.push(seq, frame(seq))
    assert [seq for seq, _ in pending.take()] == [1, 2, 3]  # in flight when the run ends
    assert pending.keep() == tmp_path / "run1"
    # The sender goes on while the process lives: acks read the spool back into memory,
    # which must not cost the files what memory alone now holds.
    for acked in (3, 6, 9):
        pending.ack(acked)
        pending.take()
    pending.release()  # the process ends with 10, 11 and 12 in flight

    run = load(tmp_path / "run1")
    assert (run.server, run.hello) == (meta["server"], HELLO)
    assert os.stat(tmp_path / "run1" / META_FILE).st_mode & 0o777 == 0o600  # the secret
    assert [seq for seq, _ in run.frames()] == list(range(1, 31))  # each once, in order
    assert run.damage == []


def test_a_damaged_segment_yields_its_whole_records_then_says_where_it_broke(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, "run1", max_bytes=2**20)
    for seq in range(1, 4):
        spool.append(seq, frame(seq))
    [path] = segments(spool)
    record = HEADER.size + len(frame(1))
    os.truncate(path, 3 * record - 10)
    read: list[int] = []
    with pytest.raises(SpoolError) as cut:
        read.extend(seq for seq, _ in read_segment(path))
    assert read == [1, 2]
    assert str(cut.value) == (
        f"{path}: the record at byte {2 * record} is cut short ({len(frame(3)) - 10} of its "
        f"{len(frame(3))} bytes); the {record - 10} bytes from there on cannot be read"
    )
    data = bytearray(path.read_bytes())
    data[HEADER.size + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SpoolError, match="record at byte 0 fails its CRC check"):
        next(read_segment(path))
    spool.close()


def test_a_spool_is_claimed_by_one_sender_at_a_time(tmp_path: Path) -> None:
    """Two runs started at once (a job's workers) both look for leftovers: one delivers."""
    spool = Spool(tmp_path, "run1", max_bytes=2**20)
    spool.append(1, frame(1))
    assert spool.directory is not None
    with claim(spool.directory) as mine:
        assert not mine  # the live run holds it
    spool.release()
    with claim(spool.directory) as first, claim(spool.directory) as second:
        assert (first, second) == (True, False)
    with claim(spool.directory) as mine:
        assert mine  # let go again when the block ended
