"""analyzer.tables.frames: the grouped sums the brief takes a slice of rows at a time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.tables import frames


@pytest.mark.parametrize("slice_rows", [7, 1 << 18])
def test_grouped_sums_equal_a_pandas_groupby(monkeypatch, slice_rows: int) -> None:
    # GIVEN rows with two categorical keys (some missing), a weight and a mask
    rng = np.random.default_rng(3)
    n = 1000
    df = pd.DataFrame(
        {
            "a": pd.Categorical(rng.choice(["x", "y", None], n)),
            "b": pd.Categorical(rng.choice(["p", "q", "r", None], n)),
            "w": rng.integers(0, 100, n),
        }
    )
    keep = rng.random(n) < 0.7
    monkeypatch.setattr(frames, "SLICE_ROWS", slice_rows)
    a, a_cats = frames.category_codes(df["a"])
    b, b_cats = frames.category_codes(df["b"])
    w = df["w"].to_numpy()
    # WHEN summed in slices
    got = frames.grouped_sums(
        n, [(a, len(a_cats)), (b, len(b_cats))], {"w": lambda sl: w[sl], "n": None}, mask=lambda sl: keep[sl]
    )
    # THEN each cell is the group-by's sum and count over the kept rows with both keys
    want = df[keep].dropna().groupby(["a", "b"], observed=True)["w"].agg(["sum", "count"])
    for (x, y), row in want.iterrows():
        i, j = a_cats.index(x), b_cats.index(y)
        assert got["w"][i, j] == row["sum"] and got["n"][i, j] == row["count"]
    assert got["n"].sum() == want["count"].sum()


def test_category_codes_of_a_plain_column_and_floats_of_a_nullable_one() -> None:
    codes, cats = frames.category_codes(pd.Series(["b", None, "a", "b"]))
    assert cats == ["a", "b"] and codes.tolist() == [1, -1, 0, 1]
    got = frames.floats(pd.Series([1, None, 3], dtype="Int64"))
    assert got.dtype == np.float64 and np.isnan(got[1]) and got[[0, 2]].tolist() == [1.0, 3.0]
