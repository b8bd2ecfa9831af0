"""The one LRU eviction under a byte cap, the one stale-folder sweep and the one reader of
numeric environment variables, on real folders and real variables."""
from __future__ import annotations

import os
import time

import pytest

from layerswap_core.checkpoints import hub
from layerswap_core.checkpoints.cache import evict_lru, folder_bytes
from layerswap_core.checkpoints.writing import remove_stale
from layerswap_core.engines.pool import per_trio_from_env
from layerswap_core.settings import env_number
from layerswap_core.workbench.saves import Quotas
from layerswap_core.workbench.served import Limits


def folder(path, nbytes: int, age_hours: float):
    path.mkdir(parents=True)
    (path / "sub").mkdir()
    (path / "sub" / "weights.bin").write_bytes(b"x" * nbytes)
    when = time.time() - age_hours * 3600
    os.utime(path, (when, when))
    return path


def test_lru_evicts_the_oldest_folders_not_in_use_until_the_new_one_fits(tmp_path):
    old, older, oldest = (folder(tmp_path / n, 100, h) for n, h in
                          (("old", 1), ("older", 2), ("oldest", 3)))
    in_use = folder(tmp_path / "in-use", 100, 4)
    sizes = {p: folder_bytes(p) for p in (old, older, oldest, in_use)}
    assert sizes[old] == 100 and folder_bytes(tmp_path / "missing") == 0

    def by_mtime(p):
        return p.stat().st_mtime

    # 400 used, cap 350: 150 more need 200 freed -> the two oldest not in use go, no more
    used = evict_lru(sizes, 400, 150, 350, oldest_first=by_mtime, keep=lambda p: p == in_use)
    assert used == 200
    assert old.exists() and in_use.exists() and not oldest.exists() and not older.exists()
    # what cannot be freed is said by the result: the caller refuses
    left = {p: s for p, s in sizes.items() if p.exists()}
    used = evict_lru(left, 200, 500, 350, oldest_first=by_mtime, keep=lambda p: True)
    assert used == 200 and old.exists() and in_use.exists()


def test_remove_stale_takes_only_the_folders_it_is_told(tmp_path):
    stale = folder(tmp_path / "layerswap-dl-a", 1, 10)
    fresh = folder(tmp_path / "layerswap-dl-b", 1, 0)
    other = folder(tmp_path / "bench-c", 1, 10)
    (tmp_path / "layerswap-dl-link").symlink_to(other)     # a link is never followed, nor removed
    gone = remove_stale(tmp_path, lambda p: p.name.startswith("layerswap-dl-")
                        and time.time() - p.stat().st_mtime > 3600)
    assert gone == [stale] and not stale.exists() and fresh.exists() and other.exists()
    assert remove_stale(tmp_path / "missing", lambda p: True) == []


def test_env_number_unset_blank_or_unreadable_is_the_default(monkeypatch):
    name = "LAYERSWAP_TEST_NUMBER"
    monkeypatch.delenv(name, raising=False)
    assert env_number(name, 7, int) == 7
    for raw in ("", "  ", "seven", "2.5"):                  # 2.5 is not a whole number
        monkeypatch.setenv(name, raw)
        assert env_number(name, 7, int) == 7, raw
    monkeypatch.setenv(name, " 12 ")
    assert env_number(name, 7, int) == 12
    monkeypatch.setenv(name, "0")
    assert env_number(name, 7, int) == 0                    # a plain number, even 0, as given
    monkeypatch.setenv(name, "2.5")
    assert env_number(name, 1.0) == 2.5
    # a limit that can be lifted: off words, 0 and below mean no limit; junk is the default
    for raw in ("off", "None", "0", "-3", "unlimited"):
        monkeypatch.setenv(name, raw)
        assert env_number(name, 10.0, off=True) is None, raw
    monkeypatch.setenv(name, "ten")
    assert env_number(name, 10.0, off=True) == 10.0


def test_the_servers_limits_read_their_variables_through_it(monkeypatch):
    monkeypatch.setenv("LAYERSWAP_MAX_SHOTS", "junk")
    monkeypatch.setenv("LAYERSWAP_MAX_EVAL_QUESTIONS", "40")
    limits = Limits.from_env()
    assert limits.shots == Limits.shots and limits.eval_questions == 40
    monkeypatch.setenv("LAYERSWAP_MAX_DOWNLOADS", "0")
    monkeypatch.setenv("LAYERSWAP_HUB_TIMEOUT", "junk")
    monkeypatch.setenv("LAYERSWAP_MAX_HUB_CACHE_GB", "off")
    h = hub.HubLimits.from_env()
    assert (h.jobs, h.timeout, h.cache_bytes) == (1, hub.HubLimits.timeout, None)
    monkeypatch.setenv("LAYERSWAP_SAVES_HOURS", "0")
    monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB", "1.5")
    q = Quotas.from_env()
    assert q.keep_seconds is None and q.total == int(1.5 * hub.GB)
    monkeypatch.setenv("LAYERSWAP_ENGINES_PER_TRIO", "x")
    assert per_trio_from_env() == 1


@pytest.mark.parametrize("raw", ["5", "5.0", " 5 "])
def test_the_local_download_limit_reads_like_the_served_one(monkeypatch, raw):
    monkeypatch.setenv("LAYERSWAP_MAX_DOWNLOAD_GB", raw)
    assert hub.HubLimits.from_env(served=False).max_download == 5 * hub.GB
    assert env_number("LAYERSWAP_MAX_DOWNLOAD_GB", None, off=True) == 5.0
