"""Click-through data sets for `--model=wide_deep`: MovieLens 100K and a Criteo-shaped synthetic.

Every example has three parts, all arrays the same in every task of a cluster:

- `dense`: float32 `[N, D]` numeric features, scaled to about [0, 1];
- `categorical`: int64 `[N, F]`, field f's id in `[0, field_sizes[f])` (an
  embedding row per id in the deep part, one weight per id in the wide);
- `crosses`: int64 `[N, C]`, hashed pairs of fields in `[0, hash_buckets)`
  (the wide part only);

and `label` int64 `[N]` in {0, 1}.

- `movielens` (`lowlevel.data.movielens`, the seeded 80/20 split): categorical
  user, item, age bucket, gender, occupation, zip prefix (first 3
  characters, hashed), release decade; dense: the film's 19 genre flags,
  age/100 and (release year - 1900)/100; crosses (hashed): user x genre of
  the film's first genre, item x gender, item x age bucket, occupation x
  first genre. Label: rating >= 4.
- `synthetic_ctr`: Criteo's shape (13 dense, 26 categorical fields). The
  `vocab_size` rows are spread over the fields in proportion to the
  cardinalities of Criteo's Kaggle set (three fields hold three quarters of them),
  each at least 2. Ids are Zipf-distributed (exponent 1.1), then scrambled
  over the field's rows (so the hot rows are not all in the first shard).
  Labels come from a hidden logistic model (a pseudo-random weight per id,
  computed from the id, plus dense weights), so the task is learnable.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Optional

import numpy as np

from lowlevel.data import movielens, replaceable
from lowlevel.data.sharding import shard_indices

DEFAULT_MOVIELENS_DIR = os.path.join(".", "data", "ml-100k")
# Cardinalities of Criteo's Kaggle display-advertising set's 26 categorical fields.
CRITEO_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
NUM_DENSE = 13
ZIPF_EXPONENT = 1.1
AGE_BUCKETS = (18, 25, 35, 45, 50, 56)  # GroupLens' ML-1M age groups


@dataclasses.dataclass(frozen=True)
class CtrSplit(movielens.Columns):
    """dense float32 `[N, D]`, categorical int64 `[N, F]`, crosses int64 `[N, C]`, labels int64 `[N]`."""

    dense: np.ndarray
    categorical: np.ndarray
    crosses: np.ndarray
    labels: np.ndarray


@dataclasses.dataclass(frozen=True)
class CtrDataSet:
    """A click-through data set: splits plus each categorical field's name and number of rows."""

    name: str
    train: CtrSplit
    test: CtrSplit
    field_names: tuple[str, ...]
    field_sizes: tuple[int, ...]
    cross_names: tuple[str, ...]
    hash_buckets: int
    num_classes: int = 2  # binary: the model gives one logit
    max_value: float = 1.0  # unused: features come scaled (the image sets' pixel maximum)

    @property
    def num_dense(self) -> int:
        """D: the dense features per example."""
        return self.train.dense.shape[1]

    def train_iterator(self, batch_size: int, num_shards: int, shard: int, seed: int):
        """Worker `shard`'s training input: `train_iterator(self, ...)`."""
        return train_iterator(self, batch_size, num_shards, shard, seed)

    def eval_input(self, split: CtrSplit, batch_size: int = 1000):
        """`split` of this data set in order: `eval_input(split, batch_size)`."""
        return eval_input(split, batch_size)

    def probe_inputs(self) -> dict:
        """A batch of one all-zero example: `probe_features(self)`."""
        return probe_features(self)


def _hash(values: np.ndarray, buckets: int, salt: str) -> np.ndarray:
    """Stable hash of each value's string into [0, buckets) (crc32; the same in every process)."""
    return np.array([zlib.crc32(f"{salt}:{v}".encode()) % buckets for v in values.tolist()],
                    dtype=np.int64)


def _ids(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Values -> ids in [0, number of distinct values), sorted order; and that number."""
    vocab, ids = np.unique(values, return_inverse=True)
    return ids.astype(np.int64), len(vocab)


def movielens_features(ratings: movielens.Ratings, hash_buckets: int) -> tuple[CtrSplit, dict]:
    """The CTR features of MovieLens ratings; returns (split, {field: rows}) in field order.

    Ids with a known vocabulary (users 1-943, films 1-1682, occupations,
    genders, age buckets, decades) are taken as ids; the zip prefix and the
    crosses are hashed into `hash_buckets`.
    """
    genres = ratings.genres.astype(np.int64)
    first_genre = np.argmax(genres, axis=1)
    age_bucket = np.searchsorted(AGE_BUCKETS, ratings.age, side="right").astype(np.int64)
    decade = np.where(ratings.release_year > 0, (ratings.release_year - 1900) // 10, 0)
    occupation, num_occupations = _ids(ratings.occupation)
    gender, num_genders = _ids(ratings.gender)
    zips = np.array([z[:3] for z in ratings.zip_code.tolist()])
    fields = {
        "user": (ratings.user_id - 1, movielens.NUM_USERS),
        "item": (ratings.item_id - 1, movielens.NUM_ITEMS),
        "age_bucket": (age_bucket, len(AGE_BUCKETS) + 1),
        "gender": (gender, max(num_genders, 2)),
        "occupation": (occupation, max(num_occupations, 21)),
        "zip_prefix": (_hash(zips, hash_buckets, "zip"), hash_buckets),
        "release_decade": (np.clip(decade, 0, 15).astype(np.int64), 16),
    }
    pairs = (("user", first_genre), ("item", gender), ("item", age_bucket),
             ("occupation", first_genre))
    crosses = [_hash(fields[a][0] * 1000 + b, hash_buckets, f"{a}x{i}")
               for i, (a, b) in enumerate(pairs)]
    dense = np.concatenate([
        genres.astype(np.float32), (ratings.age / 100.0).astype(np.float32)[:, None],
        (np.where(ratings.release_year > 0, ratings.release_year - 1900, 90) / 100.0
         ).astype(np.float32)[:, None]], axis=1)
    split = CtrSplit(dense, np.stack([ids for ids, _ in fields.values()], axis=1),
                     np.stack(crosses, axis=1), ratings.label.astype(np.int64))
    return split, {name: size for name, (_, size) in fields.items()}


def load_movielens(data_dir: Optional[str], hash_buckets: int, seed: int = 0) -> CtrDataSet:
    """MovieLens 100K from `data_dir` (default ./data/ml-100k), split 80/20 with `seed`.

    Raises:
      errors.MovieLensError: files missing or malformed (names scripts/get_movielens).
    """
    ratings = movielens.load(data_dir or DEFAULT_MOVIELENS_DIR)
    features, sizes = movielens_features(ratings, hash_buckets)
    order = np.random.default_rng(seed).permutation(len(features))
    num_test = len(features) // 5  # the same split as movielens.split(ratings, 0.2, seed)
    train = features.take(np.sort(order[num_test:]))
    test = features.take(np.sort(order[:num_test]))
    return CtrDataSet("movielens", train, test, tuple(sizes), tuple(sizes.values()),
                      ("user_x_genre", "item_x_gender", "item_x_age", "occupation_x_genre"),
                      hash_buckets)


def criteo_field_sizes(vocab_size: int) -> tuple[int, ...]:
    """`vocab_size` rows over 26 fields in proportion to Criteo's cardinalities, each >= 2."""
    total = sum(CRITEO_CARDINALITIES)
    sizes = [max(2, int(vocab_size * c / total)) for c in CRITEO_CARDINALITIES]
    sizes[2] += vocab_size - sum(sizes)  # the rounding's rest (either sign): the largest field
    return tuple(sizes)


def synthetic_ctr(vocab_size: int, hash_buckets: int, num_train: int = 65536,
                  num_test: int = 16384, seed: int = 4321) -> CtrDataSet:
    """Criteo-shaped synthetic clicks over `vocab_size` rows in all (see the module doc)."""
    rng = np.random.default_rng(seed)
    sizes = np.array(criteo_field_sizes(vocab_size), dtype=np.int64)
    n = num_train + num_test
    ranks = np.minimum(rng.zipf(ZIPF_EXPONENT, size=(n, len(sizes))) - 1, 2**40)
    # Scramble the ranks over the rows (a multiplicative hash; collisions merge rare ids only).
    categorical = (ranks * 2654435761 + 97 * np.arange(len(sizes))) % sizes
    dense = rng.exponential(1.0, size=(n, NUM_DENSE)).astype(np.float32)
    dense = np.log1p(dense).astype(np.float32)
    dense_weights = rng.standard_normal(NUM_DENSE).astype(np.float32)
    # A hidden weight per (field, id), computed from the id: no table of vocab_size floats.
    mixed = (categorical * 0x9E3779B1 + np.arange(len(sizes)) * 0x85EBCA77) % (2**31 - 1)
    id_weights = (mixed % 2001) / 1000.0 - 1.0  # uniform in [-1, 1]
    z = dense @ dense_weights * 0.5 + id_weights.sum(axis=1) * 0.6 - dense_weights.sum() * 0.3
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.int64)
    crosses = np.stack([(categorical[:, a] * 1_000_003 + categorical[:, b]) % hash_buckets
                        for a, b in ((0, 1), (2, 3), (5, 8))], axis=1).astype(np.int64)
    data = CtrSplit(dense, categorical.astype(np.int64), crosses, labels)
    return CtrDataSet("synthetic_ctr", data.take(np.arange(num_train)),
                      data.take(np.arange(num_train, n)),
                      tuple(f"C{i + 1}" for i in range(len(sizes))),
                      tuple(int(s) for s in sizes), ("C1xC2", "C3xC4", "C6xC9"), hash_buckets)


def train_iterator(data: CtrDataSet, batch_size: int, num_shards: int, shard: int, seed: int):
    """Worker `shard`'s input: every num_shards-th example, reshuffled each epoch, forever.

    Returns:
      (initializer op, feed dict, iterator); its `get_next()` is (features {"dense":
      float32 `[B, D]`, "categorical": int64 `[B, F]`, "crosses": int64 `[B, C]`},
      labels int64 `[B]`).
    """
    import tensorflow as tf
    idx = shard_indices(len(data.train), num_shards, shard)
    features, labels, feed = _placeholders(data.train.take(idx))
    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    ds = ds.shuffle(len(idx), seed=seed + shard, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    ds = replaceable.without_autotune(ds)  # a session replaced after a fault: no wait
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return it.initializer, feed, it


def eval_input(split: CtrSplit, batch_size: int = 1000):
    """`split` in order, in batches of at most `batch_size`; as `train_iterator`'s batches."""
    import tensorflow as tf
    features, labels, feed = _placeholders(split)
    ds = tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch_size)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return it.initializer, feed, it.get_next()


def probe_features(data: CtrDataSet) -> dict:
    """A batch of one all-zero example, to build the model for measuring its variables."""
    import tensorflow as tf
    return {"dense": tf.zeros([1, data.num_dense]),
            "categorical": tf.zeros([1, len(data.field_sizes)], tf.int64),
            "crosses": tf.zeros([1, len(data.cross_names)], tf.int64)}


def _placeholders(split: CtrSplit):
    import tensorflow as tf
    v1 = tf.compat.v1
    arrays = {"dense": split.dense, "categorical": split.categorical, "crosses": split.crosses}
    holders = {k: v1.placeholder(tf.as_dtype(a.dtype), a.shape) for k, a in arrays.items()}
    labels = v1.placeholder(tf.int64, split.labels.shape)
    feed = {holders[k]: a for k, a in arrays.items()}
    feed[labels] = split.labels
    return holders, labels, feed
