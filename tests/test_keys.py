"""Sort-based id lookups (analyzer.tables.lookup) give exactly what Arrow's hash kernels give."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.tables import lookup

ids = st.lists(st.one_of(st.none(), st.integers(-5, 40), st.integers(-(2**62), 2**62)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(values=ids, value_set=ids)
def test_lookups_equal_arrow_kernels(values: list, value_set: list) -> None:
    # GIVEN two columns of ids with repeats and nulls
    v = pa.array(values, pa.int64())
    s = pa.array(value_set, pa.int64())
    # THEN unique, membership and first-occurrence index equal Arrow's (nulls never match)
    want_unique = sorted(x for x in set(value_set) if x is not None)
    assert lookup.unique(s).tolist() == want_unique
    assert (
        lookup.unique(pa.chunked_array([s[: len(s) // 2], s[len(s) // 2 :]], pa.int64())).tolist()
        == want_unique
    )
    member = pc.fill_null(pc.is_in(v, value_set=s, skip_nulls=True), False).to_numpy(zero_copy_only=False)
    assert lookup.isin(v, lookup.unique(s)).tolist() == member.tolist()
    got = lookup.index_in(v, s)
    assert got.type == pa.int32()
    assert got.to_pylist() == pc.index_in(v, value_set=s, skip_nulls=True).to_pylist()


def test_other_integer_types_and_numpy_input() -> None:
    # GIVEN int32 ids in a chunked array and a numpy set
    v = pa.chunked_array([pa.array([3, None, 7], pa.int32()), pa.array([7, 1], pa.int32())])
    # THEN they are looked up as int64
    assert lookup.isin(v, np.array([1, 7])).tolist() == [False, False, True, True, True]
    assert lookup.index_in(v, np.array([7, 3, 7])).to_pylist() == [1, None, 0, 0, None]


def test_lookups_in_several_blocks(monkeypatch) -> None:
    # GIVEN lookups done a few values at a time
    monkeypatch.setattr(lookup, "BLOCK", 7)
    rng = np.random.default_rng(3)
    v = pa.array([None if x % 11 == 0 else int(x) for x in rng.integers(0, 60, 200)], pa.int64())
    s = pa.array(rng.integers(0, 60, 90), pa.int64())
    # THEN they equal Arrow's
    member = pc.fill_null(pc.is_in(v, value_set=s, skip_nulls=True), False).to_numpy(zero_copy_only=False)
    assert lookup.isin(v, lookup.unique(s)).tolist() == member.tolist()
    assert lookup.index_in(v, s).to_pylist() == pc.index_in(v, value_set=s, skip_nulls=True).to_pylist()
