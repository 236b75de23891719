"""release.py: a large structure let go a slice at a time, never in one go."""

from __future__ import annotations

import weakref

from proxy.process.release import release_in_slices


class _Key:
    """Stands for a config key: freed when its last reference goes."""


def test_frees_what_only_the_hold_references_a_slice_at_a_time() -> None:
    keys = [_Key() for _ in range(1050)]
    alive = [weakref.ref(k) for k in keys]
    hold: list[object] = list(keys)
    del keys
    freed_at_each_pause: list[int] = []

    def pause() -> None:
        freed_at_each_pause.append(sum(ref() is None for ref in alive))

    release_in_slices(hold, size=500, pause=pause)

    assert hold == []
    assert freed_at_each_pause == [500, 1000, 1050]  # 500 at most a slice, then a pause


def test_what_is_referenced_elsewhere_stays() -> None:
    kept = _Key()  # say, a key the new config kept
    hold: list[object] = [kept, _Key()]
    dropped = weakref.ref(hold[1])
    release_in_slices(hold, size=1, pause=lambda: None)
    assert hold == []
    assert dropped() is None
    assert isinstance(kept, _Key)


def test_an_empty_hold_never_pauses() -> None:
    pauses: list[None] = []
    release_in_slices([], pause=lambda: pauses.append(None))
    assert pauses == []
