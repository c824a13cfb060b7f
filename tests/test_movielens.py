"""MovieLens 100K: scripts/get_movielens, both file layouts, the split, and the error lines."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from clusters import ROOT
from lowlevel.data import movielens
from lowlevel.data.movielens import GENRES, MovieLensError

DATA = os.path.join(ROOT, "data", "ml-100k")


@pytest.fixture(scope="module")
def recbole_dir():
    """./data/ml-100k, fetched by the script users run (a no-op when it is already there)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "get_movielens"), DATA],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return DATA


@pytest.fixture(scope="module")
def ratings(recbole_dir):
    return movielens.load(recbole_dir)


def test_recbole_layout_is_all_of_movielens_100k(ratings):
    assert len(ratings) == 100_000
    assert len(set(ratings.user_id.tolist())) == 943
    assert len(set(ratings.item_id.tolist())) == 1_682
    assert set(ratings.rating.tolist()) == {1, 2, 3, 4, 5}
    assert ratings.label.mean() == pytest.approx(0.554, abs=0.001)
    assert set(ratings.gender.tolist()) == {"M", "F"}
    assert len(set(ratings.occupation.tolist())) == 21
    assert ratings.genres.shape == (100_000, len(GENRES))
    assert (ratings.genres.sum(axis=1) >= 1).all()  # every film has a genre ("unknown" too)
    assert 1919 <= ratings.release_year[ratings.release_year > 0].min()
    assert ratings.release_year.max() == 1998


def test_split_is_seeded_disjoint_and_80_20(ratings):
    train, test = movielens.split(ratings, seed=0)
    assert (len(train), len(test)) == (80_000, 20_000)
    key = lambda r: set(zip(r.user_id.tolist(), r.item_id.tolist()))  # noqa: E731
    assert not key(train) & key(test)  # a user rates a film once
    again, _ = movielens.split(ratings, seed=0)
    np.testing.assert_array_equal(train.timestamp, again.timestamp)
    other, _ = movielens.split(ratings, seed=1)
    assert not np.array_equal(train.timestamp, other.timestamp)


def write_grouplens(r: movielens.Ratings, out) -> None:
    """Writes `r` in GroupLens' own layout (u.data, u.user, u.item)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "u.data"), "w") as f:
        for row in zip(r.user_id, r.item_id, r.rating, r.timestamp):
            f.write("\t".join(map(str, row)) + "\n")
    users, items = {}, {}
    for k in range(len(r)):
        users[int(r.user_id[k])] = (r.age[k], r.gender[k], r.occupation[k], r.zip_code[k])
        items[int(r.item_id[k])] = (r.release_year[k], r.genres[k])
    with open(os.path.join(out, "u.user"), "w", encoding="latin-1") as f:
        for uid in sorted(users):
            f.write("|".join(map(str, (uid, *users[uid]))) + "\n")
    with open(os.path.join(out, "u.item"), "w", encoding="latin-1") as f:
        for iid in sorted(items):
            year, genres = items[iid]
            date = f"01-Jan-{year}" if year else ""
            f.write("|".join([str(iid), f"Film {iid}", date, "", "http://x",
                              *map(str, genres)]) + "\n")


def test_grouplens_layout_reads_the_same(ratings, tmp_path):
    write_grouplens(ratings, tmp_path)
    again = movielens.load(str(tmp_path))
    for name in ("user_id", "item_id", "rating", "timestamp", "label", "age", "gender",
                 "occupation", "zip_code", "release_year", "genres"):
        np.testing.assert_array_equal(getattr(again, name), getattr(ratings, name), name)


def test_no_data_names_the_script(tmp_path):
    with pytest.raises(MovieLensError, match="scripts/get_movielens"):
        movielens.load(str(tmp_path))


@pytest.fixture
def copied(recbole_dir, tmp_path):
    """The three RecBole files copied to tmp_path; returns a function: file name -> its lines."""
    for name in movielens.RECBOLE:
        shutil.copy(os.path.join(recbole_dir, name), tmp_path)
    return lambda name: (tmp_path / name).read_text().splitlines(keepends=True)


def test_truncated_ratings_name_the_file(copied, tmp_path):
    lines = copied("ml-100k.inter")
    (tmp_path / "ml-100k.inter").write_text("".join(lines[:50_001]))
    with pytest.raises(MovieLensError, match=r"ml-100k.inter: 50,000 rows, expected 100,000"):
        movielens.load(str(tmp_path))


def test_missing_and_malformed_files_name_the_file(copied, tmp_path):
    copied("ml-100k.item")
    (tmp_path / "ml-100k.item").unlink()
    with pytest.raises(MovieLensError, match=r"ml-100k.item: missing"):
        movielens.load(str(tmp_path))
    (tmp_path / "ml-100k.item").write_text("item_id:token\tmovie_title:token_seq\n1\tToy Story\n")
    with pytest.raises(MovieLensError, match=r"ml-100k.item: malformed line"):
        movielens.load(str(tmp_path))


def test_a_rated_film_missing_from_the_film_file_is_named(copied, tmp_path):
    lines = copied("ml-100k.item")
    item = tmp_path / "ml-100k.item"
    last = lines[-1].split("\t", 1)
    assert last[0] == "1682"
    item.write_text("".join(lines[:-1] + ["1683\t" + last[1]]))  # film 1682 renumbered
    with pytest.raises(MovieLensError, match=r"ml-100k.item: no row for id 1682, which "):
        movielens.load(str(tmp_path))
    item.write_text("".join(lines[:-1] + [lines[1]]))  # film 1682 replaced by film 1 again
    with pytest.raises(MovieLensError, match=r"ml-100k.item: id 1 twice"):
        movielens.load(str(tmp_path))
