"""MovieLens 100K as a click-through table: one row per rating, user and film features joined in.

GroupLens' MovieLens 100K (F. M. Harper and J. A. Konstan, "The MovieLens
Datasets: History and Context", ACM TiiS 5(4), 2015): 100,000 ratings (1-5)
by 943 users of 1,682 films, September 1997 - April 1998. Read from a
directory in either layout:

- GroupLens' own: `u.data` (user id, item id, rating, timestamp; tab-separated),
  `u.user` (id|age|gender|occupation|zip code), `u.item` (id|title|release
  date|video release date|IMDb URL|19 genre flags; Latin-1);
- RecBole's atomic files, as `scripts/get_movielens` extracts them from
  RecBole's wheel: `ml-100k.inter`, `ml-100k.user`, `ml-100k.item`
  (tab-separated, a typed header line; genres space-separated in `class`).

Both give the same `Ratings`. The label is "liked": rating >= 4 (55.4 % of the
ratings). The split is a seeded random 80/20 by rating (`split`). No
TensorFlow here: the launcher and tests can read the data without it.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import numpy as np

from lowlevel.errors import MovieLensError

# u.item's 19 genre flags, in file order (GroupLens' u.genre).
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western")
NUM_RATINGS, NUM_USERS, NUM_ITEMS = 100_000, 943, 1_682
GROUPLENS = ("u.data", "u.user", "u.item")
RECBOLE = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")
LIKED = 4  # a rating of at least this is a positive example


class Columns:
    """A table as a frozen dataclass of arrays with one row per example (first axis)."""

    def __len__(self) -> int:
        return len(getattr(self, dataclasses.fields(self)[0].name))

    def take(self, index: np.ndarray):
        """The rows at `index` (int array), in that order, as a table of the same type."""
        return type(self)(**{f.name: getattr(self, f.name)[index]
                             for f in dataclasses.fields(self)})


@dataclasses.dataclass(frozen=True)
class Ratings(Columns):
    """Every rating with its user's and film's features; each field has shape `[N]`.

    Attributes:
      user_id, item_id: int64 ids as in the files (1-943, 1-1682).
      rating: int64, 1-5.
      timestamp: int64 seconds since the Unix epoch.
      label: int64, 1 when `rating >= LIKED`.
      age: int64 years.
      gender: str ("M" or "F").
      occupation: str, one of GroupLens' 21.
      zip_code: str (some are not US codes, e.g. "T8H1N").
      release_year: int64, 0 when the file gives none.
      genres: int8 `[N, len(GENRES)]`, 1 for each genre of the film.
    """

    user_id: np.ndarray
    item_id: np.ndarray
    rating: np.ndarray
    timestamp: np.ndarray
    label: np.ndarray
    age: np.ndarray
    gender: np.ndarray
    occupation: np.ndarray
    zip_code: np.ndarray
    release_year: np.ndarray
    genres: np.ndarray


def layout(data_dir: str) -> tuple[str, ...]:
    """The file names `data_dir` holds: `GROUPLENS` or `RECBOLE`.

    Raises:
      MovieLensError: neither layout's ratings file is there.
    """
    for files in (GROUPLENS, RECBOLE):
        if os.path.isfile(os.path.join(data_dir, files[0])):
            return files
    raise MovieLensError(
        f"--data_dir={data_dir}: no MovieLens 100K there (expected u.data, u.user, u.item or "
        "ml-100k.inter, ml-100k.user, ml-100k.item); scripts/get_movielens puts it in "
        "./data/ml-100k")


def load(data_dir: str) -> Ratings:
    """Reads MovieLens 100K from `data_dir` (either layout) and joins users and films in.

    Raises:
      MovieLensError: a file is missing, has a malformed line, or does not hold
        all of MovieLens 100K (the message names the file and what is wrong).
    """
    files = layout(data_dir)
    paths = [os.path.join(data_dir, f) for f in files]
    ratings, users, items = _read(*paths, grouplens=files == GROUPLENS)
    for path, table, expected in zip(paths, (ratings, users, items),
                                     (NUM_RATINGS, NUM_USERS, NUM_ITEMS)):
        if len(table) != expected:
            raise MovieLensError(f"{path}: {len(table):,} rows, expected {expected:,} "
                                 "(truncated, or not MovieLens 100K)")
    user_ids, item_ids = ratings[:, 0], ratings[:, 1]
    for path, ids, table in ((paths[1], user_ids, users), (paths[2], item_ids, items)):
        unknown = sorted(set(ids.tolist()) - set(table))
        if unknown:
            raise MovieLensError(f"{path}: no row for id {unknown[0]}, which {paths[0]} rates")
    user = [users[u] for u in user_ids.tolist()]
    item = [items[i] for i in item_ids.tolist()]
    return Ratings(
        user_id=user_ids, item_id=item_ids, rating=ratings[:, 2], timestamp=ratings[:, 3],
        label=(ratings[:, 2] >= LIKED).astype(np.int64),
        age=np.array([u[0] for u in user], dtype=np.int64),
        gender=np.array([u[1] for u in user]),
        occupation=np.array([u[2] for u in user]),
        zip_code=np.array([u[3] for u in user]),
        release_year=np.array([i[0] for i in item], dtype=np.int64),
        genres=np.array([i[1] for i in item], dtype=np.int8))


def split(ratings: Ratings, test_fraction: float = 0.2, seed: int = 0
          ) -> tuple[Ratings, Ratings]:
    """(train, test): a random split by rating, the same for every task given the same seed.

    `test_fraction` of the rows (rounded down) go to the test split, chosen by
    a permutation from `np.random.default_rng(seed)`; each part keeps the
    files' order.
    """
    order = np.random.default_rng(seed).permutation(len(ratings))
    num_test = int(len(ratings) * test_fraction)
    return ratings.take(np.sort(order[num_test:])), ratings.take(np.sort(order[:num_test]))


def _lines(path: str, encoding: str = "utf-8", header: bool = False) -> list[str]:
    try:
        with open(path, encoding=encoding) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise MovieLensError(f"{path}: missing (the MovieLens files come as a set of three)"
                             ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise MovieLensError(f"{path}: cannot be read ({e})") from None
    return [line for line in lines[1 if header else 0:] if line.strip()]


def _fields(path: str, line: str, sep: str, count: int) -> list[str]:
    parts = line.split(sep)
    if len(parts) < count:
        raise MovieLensError(f"{path}: malformed line {line[:60]!r} (expected {count} "
                             f"{sep!r}-separated fields)")
    return parts


def _int(path: str, text: str) -> int:
    try:
        return int(float(text)) if text.strip() else 0
    except ValueError:
        raise MovieLensError(f"{path}: {text!r} is not a number") from None


def _add(path: str, table: dict, key: int, value) -> None:
    if key in table:
        raise MovieLensError(f"{path}: id {key} twice")
    table[key] = value


def _year(text: str) -> int:
    """A release year, or 0 where the file has none ("" in u.item, "unkonwn" in RecBole's)."""
    text = text.strip()
    return int(text) if text.isdigit() else 0


def _ratings(path: str, lines: list[str]) -> np.ndarray:
    """int64 `[len(lines), 4]` (user, item, rating, timestamp) from tab-separated lines.

    One NumPy parse of the whole text (~0.05 s for 100,000 lines, against ~0.4 s a field
    at a time) where every line is four numbers; otherwise field by field, which takes the
    first four fields of a longer line and names a line it cannot read (`MovieLensError`).
    """
    with warnings.catch_warnings():  # unmatched data: a short count, caught below
        warnings.simplefilter("ignore", DeprecationWarning)
        flat = np.fromstring(" ".join(lines).replace("\t", " "), dtype=np.float64, sep=" ")
    if flat.size == 4 * len(lines) and all(line.count("\t") == 3 for line in lines):
        return flat.reshape(-1, 4).astype(np.int64)
    return np.array([[_int(path, x) for x in _fields(path, line, "\t", 4)[:4]]
                     for line in lines], dtype=np.int64).reshape(-1, 4)


def _read(data_path: str, user_path: str, item_path: str, grouplens: bool):
    """(ratings int64 `[N, 4]` (user, item, rating, timestamp), {user: (age, gender,
    occupation, zip)}, {item: (release year, genre flags)}) from one layout's three files."""
    sep, encoding, header = ("|", "latin-1", False) if grouplens else ("\t", "utf-8", True)
    ratings = _ratings(data_path, _lines(data_path, header=header))
    users = {}
    for line in _lines(user_path, encoding, header):
        uid, age, gender, occupation, zip_code = _fields(user_path, line, sep, 5)[:5]
        _add(user_path, users, _int(user_path, uid),
             (_int(user_path, age), gender, occupation, zip_code))
    items = {}
    for line in _lines(item_path, encoding, header):
        if grouplens:  # id|title|release date ("01-Jan-1995")|video date|URL|19 flags
            parts = _fields(item_path, line, sep, 5 + len(GENRES))
            year = _year(parts[2].rpartition("-")[2])
            flags = [_int(item_path, g) for g in parts[5:5 + len(GENRES)]]
        else:  # id, title, release year, genre names
            parts = _fields(item_path, line, sep, 4)
            names = set(parts[3].split())
            if names - set(GENRES):
                raise MovieLensError(
                    f"{item_path}: unknown genre {sorted(names - set(GENRES))[0]!r}")
            year, flags = _year(parts[2]), [int(g in names) for g in GENRES]
        _add(item_path, items, _int(item_path, parts[0]), (year, flags))
    return ratings, users, items
